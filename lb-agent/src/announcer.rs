//! Announcing VIPs this node took (gratuitous ARP, unsolicited Neighbor Advertisements), from
//! one task at a bounded rate.
//!
//! Why paced: a master that takes a thousand VIPs would otherwise put a thousand broadcast
//! frames on the segment at once, three rounds over. Every host's NIC queue and every XDP
//! uplink takes them in; a queue that overflows drops VRRP advertisements with them, backups
//! that miss three take over, and their own bursts feed the next overflow (seen in the
//! 8-node lab: `ENOBUFS` on the announce socket and a group that never settled). At
//! [`FRAMES_PER_TICK`] per [`TICK`] (8,000 frames a second, far below what a switch port
//! carries, and what eight lab nodes' XDP uplinks on two cores still absorb) a thousand VIPs
//! are announced in 125 ms, ten thousand in 1.25 s.
//!
//! A VIP announced again before its rounds are done (a flap, a refresh) replaces them: the
//! latest MAC and count win, and the segment never holds two schedules for one VIP. A VIP this
//! node no longer owns is withdrawn: what it still had to send is dropped, so a master that
//! lost it never points the segment back at itself. First rounds go before repeats. A frame
//! the kernel cannot queue now (`ENOBUFS`, `EAGAIN`) is tried again a tick later, a few times.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::{sync::mpsc, task::JoinHandle};
use tracing::warn;

use crate::{
    logging::LogBudget,
    mac::MacAddr,
    vrrp::announcement::{AnnouncementSocket, announcement_for},
};

/// At most this many frames leave per [`TICK`].
pub const FRAMES_PER_TICK: usize = 8;
pub const TICK: Duration = Duration::from_millis(1);
/// Tries of a frame the kernel could not queue, the first included.
const TRIES: u32 = 4;

/// Announce `vip` from `mac` `count` times, `pause` apart, out of `socket`'s interface.
#[derive(Clone)]
pub struct Announcement {
    pub vip: IpAddr,
    pub count: u32,
    pub pause: Duration,
    pub socket: Arc<AnnouncementSocket>,
    pub mac: MacAddr,
}

enum Request {
    Announce(Vec<Announcement>),
    Withdraw(Vec<IpAddr>),
}

/// The loop's end of the task.
pub struct Announcer {
    requests: mpsc::UnboundedSender<Request>,
    task: JoinHandle<()>,
}

impl Announcer {
    pub fn spawn() -> Self {
        let (requests, rx) = mpsc::unbounded_channel();
        Self { requests, task: tokio::spawn(run(rx)) }
    }

    /// Queues `announcements`; returns at once.
    pub fn announce(&self, announcements: Vec<Announcement>) {
        if !announcements.is_empty() {
            let _ = self.requests.send(Request::Announce(announcements));
        }
    }

    /// Drops whatever is still to be sent for `vips` (this node no longer owns them).
    pub fn withdraw(&self, vips: Vec<IpAddr>) {
        if !vips.is_empty() {
            let _ = self.requests.send(Request::Withdraw(vips));
        }
    }
}

impl Drop for Announcer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run(mut rx: mpsc::UnboundedReceiver<Request>) {
    let mut schedule = Schedule::default();
    let mut failures = LogBudget::new(8, 1);
    let mut next_tick = Instant::now();
    loop {
        let wake = schedule.next_due().map(|due| due.max(next_tick));
        tokio::select! {
            received = rx.recv() => match received {
                Some(Request::Announce(announcements)) => {
                    let now = Instant::now();
                    for a in announcements {
                        schedule.add(now, a);
                    }
                }
                Some(Request::Withdraw(vips)) => {
                    for vip in vips {
                        schedule.withdraw(vip);
                    }
                }
                None => return,
            },
            () = sleep_until(wake) => {}
        }
        let now = Instant::now();
        if now < next_tick {
            continue;
        }
        let due = schedule.take_due(now, FRAMES_PER_TICK);
        if due.is_empty() {
            continue;
        }
        next_tick = now + TICK;
        for frame in due {
            let Err(e) = frame.socket.send(&announcement_for(frame.mac, frame.vip)) else { continue };
            let full = matches!(e.raw_os_error(), Some(libc::ENOBUFS | libc::EAGAIN));
            if full && frame.tries < TRIES {
                schedule.retry(frame, now + TICK);
                continue;
            }
            if let Some(held_back) = failures.allow(now) {
                warn!(vip = %frame.vip, error = %e, held_back, "announcing the VIP (gratuitous ARP or NA) failed");
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// One frame to send now.
pub struct Due {
    pub vip: IpAddr,
    pub socket: Arc<AnnouncementSocket>,
    pub mac: MacAddr,
    /// Tries of this round so far, this one included.
    pub tries: u32,
}

/// A VIP's rounds still to send.
struct Pending {
    next: Instant,
    /// Rounds sent so far: first rounds go first.
    sent: u32,
    left: u32,
    pause: Duration,
    socket: Arc<AnnouncementSocket>,
    mac: MacAddr,
    tries: u32,
}

/// The announcements still to send, by VIP (pure: times go in), with an index in sending
/// order, so a tick costs the frames it sends and not a sort of every VIP still pending (a
/// node that takes ten thousand VIPs has that many).
#[derive(Default)]
pub struct Schedule {
    pending: BTreeMap<IpAddr, Pending>,
    /// By rounds already sent (first rounds first), each VIP by when it is due.
    order: BTreeMap<u32, BTreeSet<(Instant, IpAddr)>>,
}

impl Schedule {
    /// `a`'s first round is due now; it replaces whatever `a.vip` still had to send.
    pub fn add(&mut self, now: Instant, a: Announcement) {
        self.withdraw(a.vip);
        if a.count == 0 {
            return;
        }
        let pending = Pending {
            next: now,
            sent: 0,
            left: a.count,
            pause: a.pause,
            socket: a.socket,
            mac: a.mac,
            tries: 0,
        };
        self.insert(a.vip, pending);
    }

    /// Drops what `vip` still had to send.
    pub fn withdraw(&mut self, vip: IpAddr) {
        self.remove(vip);
    }

    fn insert(&mut self, vip: IpAddr, pending: Pending) {
        self.order.entry(pending.sent).or_default().insert((pending.next, vip));
        self.pending.insert(vip, pending);
    }

    fn remove(&mut self, vip: IpAddr) -> Option<Pending> {
        let p = self.pending.remove(&vip)?;
        if let Some(round) = self.order.get_mut(&p.sent) {
            round.remove(&(p.next, vip));
            if round.is_empty() {
                self.order.remove(&p.sent);
            }
        }
        Some(p)
    }

    /// When the next frame is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.order.values().filter_map(|round| round.first().map(|(next, _)| *next)).min()
    }

    /// Up to `max` frames due by `now`: first rounds before repeats, then the longest-waiting
    /// first; each VIP's next round moves a pause on (from when it was due, so rounds keep
    /// their rhythm under pacing).
    pub fn take_due(&mut self, now: Instant, max: usize) -> Vec<Due> {
        let due: Vec<IpAddr> = self
            .order
            .values()
            .flat_map(|round| round.iter().take_while(|(next, _)| *next <= now))
            .take(max)
            .map(|(_, vip)| *vip)
            .collect();
        due.into_iter()
            .filter_map(|vip| {
                let mut p = self.remove(vip)?;
                let frame = Due { vip, socket: p.socket.clone(), mac: p.mac, tries: p.tries + 1 };
                p.left -= 1;
                p.sent += 1;
                p.tries = 0;
                p.next += p.pause;
                if p.left > 0 {
                    self.insert(vip, p);
                }
                Some(frame)
            })
            .collect()
    }

    /// `frame` could not be queued: its round is due again at `at`, unless a newer
    /// announcement of the VIP replaced it meanwhile.
    pub fn retry(&mut self, frame: Due, at: Instant) {
        match self.remove(frame.vip) {
            Some(p) if p.mac != frame.mac => self.insert(frame.vip, p),
            Some(mut p) => {
                p.left += 1;
                p.sent -= 1;
                p.next = at;
                p.tries = frame.tries;
                self.insert(frame.vip, p);
            }
            None => {
                let Due { vip, socket, mac, tries } = frame;
                let pending =
                    Pending { next: at, sent: 0, left: 1, pause: Duration::ZERO, socket, mac, tries };
                self.insert(vip, pending);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn socket() -> Arc<AnnouncementSocket> {
        // Opening an AF_PACKET socket needs CAP_NET_RAW; the schedule never sends on it.
        Arc::new(AnnouncementSocket::open(1, 0).unwrap_or_else(|_| AnnouncementSocket::closed()))
    }

    fn announcement(last: u8, count: u32, mac: u8, socket: &Arc<AnnouncementSocket>) -> Announcement {
        Announcement {
            vip: Ipv4Addr::new(198, 51, 100, last).into(),
            count,
            pause: Duration::from_millis(20),
            socket: socket.clone(),
            mac: MacAddr([2, 0, 0, 0, 0, mac]),
        }
    }

    fn vips(due: &[Due]) -> Vec<u8> {
        due.iter()
            .map(|d| match d.vip {
                IpAddr::V4(v4) => v4.octets()[3],
                IpAddr::V6(_) => 0,
            })
            .collect()
    }

    #[test]
    fn frames_leave_at_most_max_at_a_time_each_vip_count_times_a_pause_apart() {
        let (t0, s) = (Instant::now(), socket());
        let mut schedule = Schedule::default();
        for last in 1..=5 {
            schedule.add(t0, announcement(last, 2, 1, &s));
        }
        assert_eq!(vips(&schedule.take_due(t0, 3)), [1, 2, 3]);
        assert_eq!(vips(&schedule.take_due(t0 + TICK, 3)), [4, 5]);
        // Second rounds: due 20 ms after the first were (not after they left).
        assert!(schedule.take_due(t0 + Duration::from_millis(19), 10).is_empty());
        assert_eq!(schedule.next_due(), Some(t0 + Duration::from_millis(20)));
        assert_eq!(vips(&schedule.take_due(t0 + Duration::from_millis(20), 10)), [1, 2, 3, 4, 5]);
        assert!(schedule.is_empty());
    }

    #[test]
    fn a_new_announcement_of_a_vip_replaces_its_rounds_and_a_refused_frame_is_retried() {
        let (t0, s) = (Instant::now(), socket());
        let mut schedule = Schedule::default();
        schedule.add(t0, announcement(1, 3, 1, &s));
        schedule.take_due(t0, 10);
        schedule.add(t0 + TICK, announcement(1, 1, 2, &s));
        assert_eq!(schedule.len(), 1);
        let due = schedule.take_due(t0 + TICK, 10);
        assert_eq!((vips(&due), due[0].mac), (vec![1], MacAddr([2, 0, 0, 0, 0, 2])));
        assert!(schedule.is_empty(), "the old rounds are gone");

        let frame = due.into_iter().next().unwrap();
        schedule.retry(frame, t0 + TICK * 2);
        let again = schedule.take_due(t0 + TICK * 2, 10);
        assert_eq!((vips(&again), again[0].tries), (vec![1], 2));
        // A retry loses to a newer announcement with another MAC.
        schedule.add(t0 + TICK * 3, announcement(1, 1, 3, &s));
        schedule.retry(again.into_iter().next().unwrap(), t0 + TICK * 3);
        assert_eq!(schedule.take_due(t0 + TICK * 3, 10)[0].mac, MacAddr([2, 0, 0, 0, 0, 3]));
    }

    #[test]
    fn first_rounds_go_before_repeats_and_a_withdrawn_vip_sends_nothing_more() {
        let (t0, s) = (Instant::now(), socket());
        let mut schedule = Schedule::default();
        schedule.add(t0, announcement(1, 3, 1, &s));
        schedule.add(t0, announcement(2, 3, 1, &s));
        assert_eq!(vips(&schedule.take_due(t0, 2)), [1, 2]);
        // Their second rounds are due at 20 ms; a VIP taken at 25 ms goes first all the same.
        schedule.add(t0 + Duration::from_millis(25), announcement(3, 1, 1, &s));
        assert_eq!(vips(&schedule.take_due(t0 + Duration::from_millis(25), 1)), [3]);
        schedule.withdraw(Ipv4Addr::new(198, 51, 100, 1).into());
        assert_eq!(vips(&schedule.take_due(t0 + Duration::from_millis(25), 10)), [2]);
        assert_eq!(schedule.len(), 1);
    }
}
