//! Transparent capture (design section 15): clients that ignore `HTTP_PROXY` are mediated
//! too. The backend makes a TUN device the default route of the sandbox's network
//! namespace and hands its descriptor out; here, in the shim (outside the sandbox), a
//! user-space TCP/IP stack (smoltcp, [`stack`]) serves it:
//!
//! - [`dns`]: the stub resolver the sandbox's `/etc/resolv.conf` names, answering A/AAAA
//!   with synthetic addresses ([`addrs`]) mapped back to names ([`names`]);
//! - [`flow`]: each TCP connection becomes `CONNECT host:port` on the authority's channel,
//!   so the mediator decides, vets, pins, routes and logs it (`capture: true`); a denial
//!   resets the child's connection at once;
//! - [`drops`]: UDP other than DNS, ICMP and every other protocol are dropped and counted.
//!
//! It runs on a thread of its own with its own runtime, and never enters the sandbox.

mod addrs;
mod dns;
mod drops;
mod flow;
mod names;
mod ssh;
mod stack;

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

pub(crate) use addrs::Addresses;
pub(crate) use drops::Dropped;
pub(crate) use flow::Dial;
pub(crate) use stack::{MTU, TUN_QUEUE};

use crate::error::{Error, Result};
use crate::report::Denials;

/// How long the stack may take, once the sandbox has ended, to read what it sent.
const FINAL_READ: Duration = Duration::from_millis(500);

/// A running capture: the stack's thread and what it counts.
pub(crate) struct Capture {
    thread: std::thread::JoinHandle<()>,
    stop: tokio::sync::oneshot::Sender<()>,
    /// Dropped to wake the thread while it waits for the first packet.
    wake: std::os::unix::net::UnixStream,
    flows: Arc<flow::Flows>,
}

/// Waits until `tun` has a packet to read (`true`), or until `woken` hangs up with none
/// on the device (`false`: the run is over and the sandbox sent nothing; what it sent is
/// queued on the device by the time it has ended, so nothing is missed). A device that
/// fails (its namespace gone) has nothing more to read: the wait is then for `woken`
/// alone. A failed wait says `true`: the stack starts and meets the error itself.
fn first_packet(tun: &OwnedFd, woken: &std::os::unix::net::UnixStream) -> bool {
    use rustix::event::{PollFd, PollFlags};
    loop {
        let mut fds = [
            PollFd::new(woken, PollFlags::IN),
            PollFd::new(tun, PollFlags::IN),
        ];
        match rustix::event::poll(&mut fds, None) {
            Ok(_) if fds[1].revents().contains(PollFlags::IN) => return true,
            Ok(_) if !fds[0].revents().is_empty() => return false,
            // POLLERR or POLLHUP without data: nothing will come from the device.
            Ok(_) if !fds[1].revents().is_empty() => {
                let mut wake = [PollFd::new(woken, PollFlags::IN)];
                while let Err(rustix::io::Errno::INTR) = rustix::event::poll(&mut wake, None) {}
                return false;
            }
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => return true,
        }
    }
}

/// What capture did during the run, for `--report`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Summary {
    /// `on`, `off` (`--no-capture`) or `unavailable` (the TUN device could not be made).
    pub(crate) state: &'static str,
    /// Why it is unavailable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
    /// Captured TCP connections asked for on the channel.
    pub(crate) connections: u64,
    /// Of those, the ones refused (denied by the mediator, or the channel failed); each
    /// denial is in `denials`.
    pub(crate) refused: u64,
    /// What was dropped in the namespace, per destination.
    pub(crate) dropped: Vec<Dropped>,
}

impl Summary {
    /// The summary of a run without capture.
    pub(crate) fn without(state: &'static str, reason: Option<String>) -> Self {
        Self {
            state,
            reason,
            connections: 0,
            refused: 0,
            dropped: Vec::new(),
        }
    }
}

impl Capture {
    /// Serve the sandbox's TUN device `tun` with `addrs`, carrying connections through
    /// `dial`. `grant` (embedded mode) makes the stub answer NXDOMAIN for names outside
    /// the grant it is bound to; `answers` (socket mode) takes the denials the flows read
    /// in the mediator's answers (the embedded mediator's tap records its own).
    ///
    /// # Errors
    /// [`Error::Io`] if the thread or its runtime cannot start.
    pub(crate) fn start(
        tun: OwnedFd,
        addrs: Addresses,
        dial: Dial,
        grant: Option<Arc<crate::control::Binding>>,
        (denials, trust): (Arc<Denials>, crate::rejected::Trust),
        answers: Option<crate::feed::Answers>,
    ) -> Result<Self> {
        // Each captured connection holds one descriptor here (its channel connection): the
        // soft open-files limit goes up to the hard one, as the mediator's does. The
        // sandbox was started before, with the caller's limits.
        if let Ok((_, hard)) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        {
            let _ = nix::sys::resource::setrlimit(
                nix::sys::resource::Resource::RLIMIT_NOFILE,
                hard,
                hard,
            );
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::io("start the capture runtime", e))?;
        let names = Arc::new(names::Names::default());
        let drops = Arc::new(drops::Drops::default());
        let stub = Arc::new(dns::Stub::new(
            addrs,
            Arc::clone(&names),
            grant,
            Arc::clone(&denials),
        ));
        let (shared, mut new_flows, flow_tx) = stack::build(addrs);
        let flows = Arc::new(flow::Flows {
            shared: Arc::clone(&shared),
            addrs,
            names: Arc::clone(&names),
            drops: Arc::clone(&drops),
            stub: Arc::clone(&stub),
            dial,
            denials,
            answers,
            trust,
            connections: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            channel_errors: AtomicU64::new(0),
        });
        let ended = Arc::new(tokio::sync::Notify::new());
        let parts = stack::Parts {
            addrs,
            stub,
            names,
            drops,
            ended: Arc::clone(&ended),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (wake, woken) = std::os::unix::net::UnixStream::pair()
            .map_err(|e| Error::io("start the capture thread", e))?;
        let f = Arc::clone(&flows);
        let thread = std::thread::Builder::new()
            .name("capture".into())
            .spawn(move || {
                // The stack's loop waits for the sandbox's first packet: a run of
                // proxy-aware clients sends none, so its stack never competes with the
                // start and its end waits for no final read.
                if !first_packet(&tun, &woken) {
                    return;
                }
                runtime.block_on(async move {
                    let mut stack = tokio::spawn(stack::run(shared, tun, flow_tx, parts));
                    let dispatch = async {
                        while let Some(flow) = new_flows.recv().await {
                            tokio::spawn(flow::run(Arc::clone(&f), flow));
                        }
                    };
                    tokio::select! {
                        () = dispatch => {}
                        _ = stopped => {}
                    }
                    // What the sandbox sent before it ended is read, so its last
                    // datagrams are in the summary; then the stack stops.
                    ended.notify_one();
                    let _ = tokio::time::timeout(FINAL_READ, &mut stack).await;
                    stack.abort();
                });
                runtime.shutdown_timeout(Duration::from_millis(200));
            })
            .map_err(|e| Error::io("start the capture thread", e))?;
        Ok(Self {
            thread,
            stop,
            wake,
            flows,
        })
    }

    /// Stop (the sandbox is gone) and say what happened.
    pub(crate) fn finish(self) -> Summary {
        let _ = self.stop.send(());
        // Wakes the thread if it still waits for a first packet; what the sandbox sent is
        // queued on the device by now, so it then reads it, or ends at once if nothing.
        drop(self.wake);
        let _ = self.thread.join();
        Summary {
            state: "on",
            reason: None,
            connections: self.flows.connections.load(Ordering::Relaxed),
            refused: self.flows.refused.load(Ordering::Relaxed),
            dropped: self.flows.drops.list(),
        }
    }

    /// Captured connections that could not reach the channel.
    pub(crate) fn channel_errors(&self) -> u64 {
        self.flows.channel_errors.load(Ordering::Relaxed)
    }
}
