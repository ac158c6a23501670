//! VRRP conformance timelines, as data: each directory under `tests/conformance/vrrp/` is one
//! case (holo-vrrp's `tests/conformance/<case>/` is the model), its `timeline.yaml` the instance's
//! configuration and the events it meets, each with the time it happens and what the state
//! machine must answer. The comments in each file work out the RFC's numbers.
//!
//! Adding a case adds a directory, not test code. The format:
//!
//! ```yaml
//! instance: {priority: 100, advert_interval: 1s, preempt: true, address: 192.0.2.10}
//! steps:
//!   - at: 0s                 # from the case's start (humantime: `3s 609ms 375us`)
//!     input: startup         # startup | timer | shutdown | idle | {advert: {from, priority,
//!                            #   interval}} | {advertise_early: 50ms} | {preempt: {on, delay}}
//!                            #   | {priority: 150} | {advert_interval: 10ms}
//!     expect:                # each field optional but one of `actions` and `ignored`
//!       actions: [advertise 100, take ownership]
//!       state: master        # initialize | backup | master
//!       master: 192.0.2.10   # or none
//!       deadline: 4s 610ms   # the next timer, from the start; or none
//!       master_down_interval: 3s 609ms 375us
//! ```

use std::{
    fmt::Write as _,
    net::IpAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use lb_agent::vrrp::{
    instance::{Action, Ignored, Instance, InstanceConfig},
    packet::Advertisement,
};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Timeline {
    instance: Config,
    steps: Vec<Step>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "vrid")]
    vrid: u8,
    priority: u8,
    #[serde(deserialize_with = "duration")]
    advert_interval: Duration,
    preempt: bool,
    #[serde(default, deserialize_with = "duration")]
    preempt_delay: Duration,
    address: IpAddr,
}

fn vrid() -> u8 {
    7
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Step {
    #[serde(deserialize_with = "duration")]
    at: Duration,
    /// `input: startup`, or `input: {advert: {…}}` (a map, not YAML's `!advert` tag).
    #[serde(with = "serde_yaml::with::singleton_map")]
    input: Input,
    expect: Expect,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum Input {
    Startup,
    Timer,
    Shutdown,
    /// The shell went back to waiting for events (`Instance::idle_since`).
    Idle,
    Advert(Advert),
    AdvertiseEarly(#[serde(deserialize_with = "duration")] Duration),
    Preempt(Preempt),
    Priority(u8),
    AdvertInterval(#[serde(deserialize_with = "duration")] Duration),
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Advert {
    from: IpAddr,
    priority: u8,
    /// Max Adver Int as sent: a whole number of centiseconds.
    #[serde(deserialize_with = "duration")]
    interval: Duration,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Preempt {
    on: bool,
    #[serde(default, deserialize_with = "duration")]
    delay: Duration,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Expect {
    actions: Option<Vec<String>>,
    ignored: Option<String>,
    state: Option<String>,
    master: Option<String>,
    deadline: Option<String>,
    #[serde(default, deserialize_with = "optional_duration")]
    master_down_interval: Option<Duration>,
    #[serde(default, deserialize_with = "optional_duration")]
    skew_time: Option<Duration>,
}

fn duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_duration(&text).map_err(|e| serde::de::Error::custom(format!("{text:?}: {e}")))
}

fn optional_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

/// The words a timeline names an action by.
fn action_name(action: &Action) -> String {
    match action {
        Action::SendAdvert { priority } => format!("advertise {priority}"),
        Action::TakeOwnership => "take ownership".into(),
        Action::ReleaseOwnership => "release ownership".into(),
        Action::Reannounce => "reannounce".into(),
        Action::LeaseLapsed => "lease lapsed".into(),
    }
}

fn ignored_name(ignored: Ignored) -> &'static str {
    match ignored {
        Ignored::WeAreOwner => "we are owner",
        Ignored::NotRunning => "not running",
        Ignored::LowerPriority => "lower priority",
    }
}

/// What one step answered, in the timeline's words: its actions, or why it was ignored.
type Outcome = Result<Vec<String>, &'static str>;

/// Feeds one input; an input the instance could never receive (an interval off the wire's
/// centisecond grid) is an error in the timeline.
fn apply(instance: &mut Instance, now: Instant, input: &Input) -> Result<Outcome, String> {
    let actions = match input {
        Input::Startup => Ok(instance.startup(now)),
        Input::Timer => Ok(instance.on_timer(now)),
        Input::Shutdown => Ok(instance.shutdown()),
        Input::Idle => {
            instance.idle_since(now);
            Ok(Vec::new())
        }
        Input::Advert(advert) => {
            let centiseconds = advert.interval.as_millis() / 10;
            if advert.interval.as_nanos() % 10_000_000 != 0 || !(1..=4095).contains(&centiseconds) {
                return Err(format!(
                    "advert interval {:?}: expected 10 ms to 40.95 s in whole centiseconds",
                    advert.interval
                ));
            }
            let sent = Advertisement {
                vrid: instance.config().vrid,
                priority: advert.priority,
                max_adver_int_cs: centiseconds as u16,
                addresses: Vec::new(),
            };
            instance.on_advert(now, advert.from, &sent)
        }
        Input::AdvertiseEarly(early) => Ok(instance.advertise_early(now, *early)),
        Input::Preempt(preempt) => {
            instance.set_preempt(preempt.on, preempt.delay);
            Ok(Vec::new())
        }
        Input::Priority(priority) => {
            instance.set_priority(*priority);
            Ok(Vec::new())
        }
        Input::AdvertInterval(interval) => {
            instance.set_advert_interval(*interval);
            Ok(Vec::new())
        }
    };
    Ok(actions.map(|a| a.iter().map(action_name).collect()).map_err(ignored_name))
}

/// Every way the instance after a step differs from what the step expects.
fn mismatches(instance: &Instance, start: Instant, outcome: &Outcome, expect: &Expect) -> Vec<String> {
    let mut wrong = Vec::new();
    let mut check = |what: &str, got: String, want: &str| {
        if got != want {
            wrong.push(format!("{what}: expected {want}, got {got}"));
        }
    };
    match (&expect.actions, &expect.ignored, outcome) {
        (None, None, _) => check("expect", "neither `actions` nor `ignored`".into(), "one of them"),
        (Some(_), Some(_), _) => check("expect", "both `actions` and `ignored`".into(), "one of them"),
        (Some(want), None, got) => {
            check("actions", format!("{got:?}"), &format!("{:?}", Ok::<_, &str>(want.clone())))
        }
        (None, Some(want), got) => {
            check("ignored", format!("{got:?}"), &format!("{:?}", Err::<Vec<String>, _>(want.as_str())))
        }
    }
    if let Some(want) = &expect.state {
        check("state", instance.state().as_str().into(), want);
    }
    if let Some(want) = &expect.master {
        check("master", instance.master().map_or("none".into(), |m| m.to_string()), want);
    }
    if let Some(want) = &expect.deadline {
        let got = instance
            .next_deadline()
            .map_or("none".into(), |d| humantime::format_duration(d - start).to_string());
        let want = match want.as_str() {
            "none" => "none".to_owned(),
            text => humantime::parse_duration(text).map_or_else(
                |e| format!("(unreadable {text:?}: {e})"),
                |d| humantime::format_duration(d).to_string(),
            ),
        };
        check("deadline", got, &want);
    }
    if let Some(want) = expect.master_down_interval {
        check("master_down_interval", format!("{:?}", instance.master_down_interval()), &format!("{want:?}"));
    }
    if let Some(want) = expect.skew_time {
        check("skew_time", format!("{:?}", instance.skew_time()), &format!("{want:?}"));
    }
    wrong
}

/// Runs one timeline; the error names the case, the step and every field that differed.
fn run(name: &str, text: &str) -> Result<usize, String> {
    let timeline: Timeline =
        serde_yaml::from_str(text).map_err(|e| format!("{name}: timeline.yaml: {e}\n"))?;
    let c = &timeline.instance;
    let mut instance = Instance::new(InstanceConfig {
        vrid: c.vrid,
        priority: c.priority,
        advert_interval: c.advert_interval,
        preempt: c.preempt,
        preempt_delay: c.preempt_delay,
        primary_address: c.address,
    });
    let start = Instant::now();
    let mut report = String::new();
    for (index, step) in timeline.steps.iter().enumerate() {
        let outcome = apply(&mut instance, start + step.at, &step.input)
            .map_err(|e| format!("{name}: step {}: {e}\n", index + 1))?;
        for wrong in mismatches(&instance, start, &outcome, &step.expect) {
            let _ =
                writeln!(report, "{name}: step {} ({:?} at {:?}): {wrong}", index + 1, step.input, step.at);
        }
    }
    if report.is_empty() { Ok(timeline.steps.len()) } else { Err(report) }
}

fn cases() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/vrrp");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|entry| entry.expect("reading the conformance directory").path())
        .filter(|path| path.is_dir())
        .collect();
    cases.sort();
    cases
}

#[test]
fn every_vrrp_conformance_timeline_holds() {
    let cases = cases();
    assert!(
        cases.len() >= 20,
        "expected the conformance cases under tests/conformance/vrrp, found {}",
        cases.len()
    );
    let mut failures = String::new();
    for case in &cases {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let file = case.join("timeline.yaml");
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        match run(&name, &text) {
            Ok(steps) => assert!(steps > 0, "{name}: a timeline without steps"),
            Err(report) => failures.push_str(&report),
        }
    }
    assert!(failures.is_empty(), "conformance timelines that do not hold:\n{failures}");
}

/// The runner itself: a timeline expecting the wrong thing fails, naming the step and field,
/// and a malformed one is refused naming what was expected.
#[test]
fn a_wrong_expectation_fails_and_names_the_step_and_field() {
    let wrong = "instance: {priority: 100, advert_interval: 1s, preempt: true, address: 192.0.2.10}\n\
                 steps:\n  - at: 0s\n    input: startup\n    expect: {actions: [], state: master, deadline: 3s}\n";
    let report = run("wrong", wrong).unwrap_err();
    assert!(report.contains("wrong: step 1"), "{report}");
    assert!(report.contains("state: expected master, got backup"), "{report}");
    assert!(report.contains("deadline: expected 3s, got 3s 609ms 375us"), "{report}");

    let no_expectation = wrong.replace("{actions: [], state: master, deadline: 3s}", "{state: backup}");
    assert!(run("bare", &no_expectation).unwrap_err().contains("neither `actions` nor `ignored`"));

    let bad_interval =
        wrong.replace("input: startup", "input: {advert: {from: 192.0.2.20, priority: 200, interval: 5ms}}");
    assert!(run("interval", &bad_interval).unwrap_err().contains("whole centiseconds"));

    let unknown_input = wrong.replace("input: startup", "input: reboot");
    let error = run("unknown", &unknown_input).unwrap_err();
    assert!(error.contains("unknown: timeline.yaml") && error.contains("reboot"), "{error}");
}
