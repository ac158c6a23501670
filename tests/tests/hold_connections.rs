//! The routed-fabric benchmark's connection holder (`hold-connections`) against a line echo
//! server of the pods' protocol, in a namespace of its own: what it counts is what happened.

use std::{
    io::{BufRead, BufReader, Write},
    net::{TcpListener, TcpStream},
    process::Command,
};

use lb_lab::Netns;

/// How the server treats the `i`th connection: closes it after five answers (even `i`),
/// answers three and then nothing while keeping it open (`i` = 1), or answers all.
fn serve(stream: TcpStream, i: usize) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    writer.write_all(b"pod 10.0.0.1:1234\n").unwrap();
    let mut answered = 0;
    let mut line = String::new();
    while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
        let stall = i == 1 && answered == 3;
        if i.is_multiple_of(2) && answered == 5 {
            return;
        }
        if !stall {
            writer.write_all(format!("pod {line}").as_bytes()).unwrap();
            answered += 1;
        }
        line.clear();
    }
}

#[test]
fn the_holder_counts_opened_reset_failed_and_answered() {
    let ns = Netns::create(format!("lbt{}-hold", std::process::id()));
    let out = ns.run(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for (i, stream) in listener.incoming().enumerate() {
                let stream = stream.unwrap();
                std::thread::spawn(move || serve(stream, i));
            }
        });
        // Six connections, a request every 20 ms, for 2 s.
        Command::new(env!("CARGO_BIN_EXE_hold-connections"))
            .args(["127.0.0.1", &port.to_string(), "6", "20", "2"])
            .output()
            .unwrap()
    });
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("ready"), "{stdout}");
    let summary: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    let port = &summary[0];
    let n = |key: &str| port[key].as_u64().unwrap_or_else(|| panic!("{key} in {port}"));
    assert_eq!((n("opened"), n("refused"), n("reset")), (6, 0, 3), "{port}");
    assert!(n("failed") >= 1, "the stalled connection's requests fail: {port}");
    // Two connections answered all along for 2 s (100 requests each, give or take), the
    // others a few before they ended or stalled.
    assert!((150..=240).contains(&n("answered")), "{port}");
    assert!(n("sent") >= n("answered") && n("sent") <= n("answered") + 10, "{port}");
    assert!(port["max_wait_ms"].as_f64().unwrap() < 1000.0, "{port}");
}
