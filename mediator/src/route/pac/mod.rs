//! PAC evaluation (design section 8): `FindProxyForURLEx(url, host)` when the script
//! defines it, else `FindProxyForURL(url, host)`, run in QuickJS (`rquickjs`) with every
//! standard helper (`pac_helpers.js`).
//!
//! Why QuickJS and not boa: QuickJS has the two budgets we need built in, a hard memory
//! limit on the runtime's allocator (`set_memory_limit`) and an interrupt handler polled
//! while code runs (`set_interrupt_handler`), so `while(true){}` and a huge allocation are
//! cut off inside the engine and the runtime stays usable; it also compiles in about a
//! minute on two cores from one C library, where boa_engine pulls in a large Rust crate
//! graph (several minutes, a much bigger binary) and has no allocator limit.
//!
//! Threading: a QuickJS runtime is not `Send`, so evaluations run on a small pool of
//! dedicated threads, each with its own runtime holding the current script. Helpers that
//! resolve (`dnsResolve`, `dnsResolveEx`, `isResolvable`, `isInNet` with a name) block
//! that thread on the mediator's async resolver through a runtime [`Handle`]: the PAC
//! sees the same `hosts` map and nameservers as the connection path and never the system
//! resolver. Time spent in those lookups is not charged to the CPU budget, but each
//! evaluation may make at most [`MAX_LOOKUPS`] of them. `myIpAddress` reads the local
//! interface addresses (`getifaddrs`); nothing here opens a socket.
//!
//! A script is checked before it is installed (it must compile, finish its top level
//! within the budget and define one of the two functions), so a bad refresh keeps the
//! last good copy. After a budget overrun a worker rebuilds its runtime.

pub(crate) mod answer;
pub(crate) mod cache;
pub(crate) mod fetch;

use std::cell::Cell;
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use rquickjs::{Context, Ctx, Function, Runtime, Value};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

use crate::resolve::Resolver;

/// The helper functions, evaluated before the PAC script.
const HELPERS: &str = include_str!("pac_helpers.js");

/// Most DNS lookups one evaluation may make.
pub(crate) const MAX_LOOKUPS: u32 = 16;

/// Longest PAC answer accepted, in bytes.
const MAX_ANSWER: usize = 64 * 1024;

/// Queued evaluations beyond which new ones fail at once (never an unbounded queue).
const QUEUE: usize = 256;

/// JS stack limit inside the runtime; the worker threads get a native stack well above.
const JS_STACK: usize = 1 << 20;
const THREAD_STACK: usize = 8 << 20;

/// Why a PAC evaluation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PacError {
    /// The CPU-time budget ran out (`while(true){}`).
    Cpu(Duration),
    /// The memory limit was hit.
    Memory(usize),
    /// The script threw, failed to compile, or defines no `FindProxyForURL`.
    Script(String),
    /// The answer was not a string (or too long).
    BadAnswer(String),
    /// No evaluation could be run (queue full, workers gone, overall deadline).
    Unavailable(String),
}

impl std::error::Error for PacError {}

impl std::fmt::Display for PacError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu(d) => write!(f, "PAC evaluation exceeded its CPU budget of {d:?}"),
            Self::Memory(m) => write!(f, "PAC evaluation exceeded its memory limit of {m} bytes"),
            Self::Script(e) => write!(f, "PAC script error: {e}"),
            Self::BadAnswer(e) => write!(f, "PAC answer unusable: {e}"),
            Self::Unavailable(e) => write!(f, "PAC evaluation unavailable: {e}"),
        }
    }
}

/// Budgets of one evaluation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// CPU-time budget (wall clock spent in JS, DNS lookups excluded).
    pub cpu: Duration,
    /// Memory limit of the runtime, in bytes.
    pub memory: usize,
    /// The resolver's timeout, to bound the wait for an evaluation with lookups.
    pub dns_timeout: Duration,
}

/// What the resolving helpers need.
#[derive(Debug, Clone)]
pub(crate) struct HelperEnv {
    /// The mediator's resolver.
    pub resolver: Arc<Resolver>,
    /// A handle on the runtime the resolver runs on.
    pub handle: Handle,
}

struct Script {
    text: Arc<str>,
    generation: u64,
}

struct Job {
    url: String,
    host: String,
    reply: oneshot::Sender<Result<String, PacError>>,
}

/// A PAC script and the worker threads that evaluate it.
pub(crate) struct Pac {
    script: Arc<RwLock<Script>>,
    jobs: SyncSender<Job>,
    limits: Limits,
    env: HelperEnv,
}

impl std::fmt::Debug for Pac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pac").field("limits", &self.limits).finish()
    }
}

impl Pac {
    /// Checks `script` and starts `workers` evaluation threads (at least one).
    ///
    /// # Errors
    /// [`PacError`] when the script does not compile, overruns a budget at its top level,
    /// or defines neither `FindProxyForURL` nor `FindProxyForURLEx`.
    pub(crate) async fn start(
        script: String,
        limits: Limits,
        env: HelperEnv,
        workers: usize,
    ) -> Result<Self, PacError> {
        let text: Arc<str> = Arc::from(script);
        check(Arc::clone(&text), limits, env.clone()).await?;
        let script = Arc::new(RwLock::new(Script {
            text,
            generation: 1,
        }));
        let (tx, rx) = sync_channel::<Job>(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..workers.max(1) {
            let (rx, script, env) = (Arc::clone(&rx), Arc::clone(&script), env.clone());
            std::thread::Builder::new()
                .name(format!("pac-{i}"))
                .stack_size(THREAD_STACK)
                .spawn(move || worker(&rx, &script, limits, &env))
                .map_err(|e| PacError::Unavailable(format!("cannot start a PAC thread: {e}")))?;
        }
        Ok(Self {
            script,
            jobs: tx,
            limits,
            env,
        })
    }

    /// Replaces the script after checking it; on error the current script stays.
    ///
    /// # Errors
    /// As [`Pac::start`].
    pub(crate) async fn install(&self, script: String) -> Result<bool, PacError> {
        let same = self
            .script
            .read()
            .map(|s| *s.text == *script)
            .unwrap_or(false);
        if same {
            return Ok(false);
        }
        let text: Arc<str> = Arc::from(script);
        check(Arc::clone(&text), self.limits, self.env.clone()).await?;
        let mut current = self
            .script
            .write()
            .map_err(|_| PacError::Unavailable("PAC script lock poisoned".into()))?;
        current.generation += 1;
        current.text = text;
        Ok(true)
    }

    /// The installed script's generation (1 at start, +1 per installed change): cached
    /// answers carry the generation they were computed under and are ignored after a change.
    pub(crate) fn generation(&self) -> u64 {
        self.script.read().map(|s| s.generation).unwrap_or(0)
    }

    /// Evaluates the script for `url` and `host`; returns its answer string.
    ///
    /// # Errors
    /// [`PacError`] for a budget overrun, an exception, a non-string answer, or when the
    /// evaluation cannot be queued or does not finish in time.
    pub(crate) async fn find(&self, url: &str, host: &str) -> Result<String, PacError> {
        let (reply, rx) = oneshot::channel();
        let job = Job {
            url: url.to_owned(),
            host: host.to_owned(),
            reply,
        };
        match self.jobs.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(PacError::Unavailable(
                    "too many queued PAC evaluations".into(),
                ));
            }
            Err(TrySendError::Disconnected(_)) => {
                return Err(PacError::Unavailable("PAC workers stopped".into()));
            }
        }
        let wait =
            self.limits.cpu * 2 + self.limits.dns_timeout * MAX_LOOKUPS + Duration::from_secs(1);
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(PacError::Unavailable("PAC worker ended".into())),
            Err(_) => Err(PacError::Unavailable(format!(
                "no PAC answer within {wait:?}"
            ))),
        }
    }
}

/// Compiles and runs `text` in a fresh runtime off the async threads.
async fn check(text: Arc<str>, limits: Limits, env: HelperEnv) -> Result<(), PacError> {
    tokio::task::spawn_blocking(move || Engine::new(&text, 0, limits, &env).map(drop))
        .await
        .map_err(|e| PacError::Unavailable(format!("PAC check task failed: {e}")))?
}

fn worker(rx: &Mutex<Receiver<Job>>, script: &RwLock<Script>, limits: Limits, env: &HelperEnv) {
    let mut engine: Option<Engine> = None;
    loop {
        let job = {
            let Ok(rx) = rx.lock() else { return };
            match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        let Ok((text, generation)) = script.read().map(|s| (Arc::clone(&s.text), s.generation))
        else {
            let _ = job
                .reply
                .send(Err(PacError::Unavailable("lock poisoned".into())));
            continue;
        };
        if engine.as_ref().is_none_or(|e| e.generation != generation) {
            engine = None;
            match Engine::new(&text, generation, limits, env) {
                Ok(e) => engine = Some(e),
                Err(e) => {
                    let _ = job.reply.send(Err(e));
                    continue;
                }
            }
        }
        let result = match &engine {
            Some(e) => e.find(&job.url, &job.host),
            None => Err(PacError::Unavailable("no PAC engine".into())),
        };
        if matches!(result, Err(PacError::Cpu(_) | PacError::Memory(_))) {
            // The runtime may be left mid-way (half-built objects, memory at its limit):
            // rebuild it for the next evaluation.
            engine = None;
        }
        let _ = job.reply.send(result);
    }
}

/// Per-evaluation budget state shared with the interrupt handler and the helpers.
struct Budget {
    deadline: Cell<Instant>,
    tripped: Cell<bool>,
    lookups: Cell<u32>,
}

/// One QuickJS runtime with the helpers and a script loaded.
struct Engine {
    // Field order: the context must drop before its runtime.
    ctx: Context,
    rt: Runtime,
    budget: Rc<Budget>,
    limits: Limits,
    generation: u64,
}

impl Engine {
    fn new(text: &str, generation: u64, limits: Limits, env: &HelperEnv) -> Result<Self, PacError> {
        let rt = Runtime::new().map_err(|e| PacError::Unavailable(e.to_string()))?;
        rt.set_memory_limit(limits.memory);
        rt.set_max_stack_size(JS_STACK);
        let budget = Rc::new(Budget {
            deadline: Cell::new(Instant::now() + limits.cpu),
            tripped: Cell::new(false),
            lookups: Cell::new(0),
        });
        {
            let b = Rc::clone(&budget);
            rt.set_interrupt_handler(Some(Box::new(move || {
                if Instant::now() >= b.deadline.get() {
                    b.tripped.set(true);
                    true
                } else {
                    false
                }
            })));
        }
        let ctx = Context::full(&rt).map_err(|e| PacError::Unavailable(e.to_string()))?;
        let engine = Self {
            ctx,
            rt,
            budget,
            limits,
            generation,
        };
        engine.arm();
        let loaded = engine.ctx.with(|ctx| -> Result<(), PacError> {
            install_natives(&ctx, &engine.budget, env).map_err(|e| engine.classify(&ctx, e))?;
            ctx.eval::<(), _>(HELPERS)
                .map_err(|e| engine.classify(&ctx, e))?;
            ctx.eval::<(), _>(text.as_bytes().to_vec())
                .map_err(|e| engine.classify(&ctx, e))?;
            let globals = ctx.globals();
            let has = |name: &str| {
                globals
                    .get::<_, Value<'_>>(name)
                    .is_ok_and(|v| v.is_function())
            };
            if has("FindProxyForURLEx") || has("FindProxyForURL") {
                Ok(())
            } else {
                Err(PacError::Script(
                    "the script defines neither FindProxyForURL nor FindProxyForURLEx".into(),
                ))
            }
        });
        loaded?;
        Ok(engine)
    }

    /// Starts a fresh budget.
    fn arm(&self) {
        self.budget.deadline.set(Instant::now() + self.limits.cpu);
        self.budget.tripped.set(false);
        self.budget.lookups.set(0);
    }

    fn find(&self, url: &str, host: &str) -> Result<String, PacError> {
        self.arm();
        let result = self.ctx.with(|ctx| -> Result<String, PacError> {
            let globals = ctx.globals();
            let func: Function<'_> = match globals.get::<_, Value<'_>>("FindProxyForURLEx") {
                Ok(v) if v.is_function() => v.into_function(),
                _ => globals
                    .get::<_, Value<'_>>("FindProxyForURL")
                    .ok()
                    .and_then(Value::into_function),
            }
            .ok_or_else(|| PacError::Script("FindProxyForURL is gone".into()))?;
            let answer: Value<'_> = func.call((url, host)).map_err(|e| self.classify(&ctx, e))?;
            let Some(s) = answer.as_string() else {
                return Err(PacError::BadAnswer(format!(
                    "FindProxyForURL returned {}, not a string",
                    answer.type_name()
                )));
            };
            let s = s
                .to_string()
                .map_err(|e| PacError::BadAnswer(e.to_string()))?;
            if s.len() > MAX_ANSWER {
                return Err(PacError::BadAnswer(format!(
                    "answer longer than {MAX_ANSWER} bytes"
                )));
            }
            Ok(s)
        });
        if result.is_err() {
            self.rt.run_gc();
        }
        result
    }

    /// Maps an engine error to the budget that caused it, or the script's exception.
    fn classify(&self, ctx: &Ctx<'_>, err: rquickjs::Error) -> PacError {
        if self.budget.tripped.get() {
            return PacError::Cpu(self.limits.cpu);
        }
        let message = if err.is_exception() {
            let exc = ctx.catch();
            exc.as_exception()
                .map(|e| e.message().unwrap_or_else(|| "exception".into()))
                .or_else(|| exc.as_string().and_then(|s| s.to_string().ok()))
                .unwrap_or_else(|| format!("thrown {}", exc.type_name()))
        } else {
            err.to_string()
        };
        if message.contains("out of memory") || matches!(err, rquickjs::Error::Allocation) {
            return PacError::Memory(self.limits.memory);
        }
        PacError::Script(message.chars().take(300).collect())
    }
}

fn install_natives<'js>(
    ctx: &Ctx<'js>,
    budget: &Rc<Budget>,
    env: &HelperEnv,
) -> rquickjs::Result<()> {
    let globals = ctx.globals();
    let lookup = {
        let (budget, env) = (Rc::clone(budget), env.clone());
        Rc::new(move |host: &str| -> Vec<IpAddr> { resolve(&budget, &env, host) })
    };
    {
        let lookup = Rc::clone(&lookup);
        globals.set(
            "__dnsResolve",
            Function::new(ctx.clone(), move |host: String| -> Option<String> {
                lookup(&host)
                    .into_iter()
                    .find(IpAddr::is_ipv4)
                    .map(|ip| ip.to_string())
            })?,
        )?;
    }
    {
        let lookup = Rc::clone(&lookup);
        globals.set(
            "__dnsResolveEx",
            Function::new(ctx.clone(), move |host: String| -> String {
                join(&lookup(&host))
            })?,
        )?;
    }
    globals.set(
        "__myIpAddress",
        Function::new(ctx.clone(), || -> String {
            local_addrs()
                .into_iter()
                .find(IpAddr::is_ipv4)
                .map_or_else(|| "127.0.0.1".to_owned(), |ip| ip.to_string())
        })?,
    )?;
    globals.set(
        "__myIpAddressEx",
        Function::new(ctx.clone(), || -> String {
            let addrs = local_addrs();
            if addrs.is_empty() {
                "127.0.0.1".to_owned()
            } else {
                join(&addrs)
            }
        })?,
    )?;
    globals.set(
        "__isInNetEx",
        Function::new(ctx.clone(), |ip: String, prefix: String| -> bool {
            is_in_net_ex(&ip, &prefix)
        })?,
    )?;
    globals.set(
        "__sortIpAddressList",
        Function::new(ctx.clone(), |list: String| -> Option<String> {
            sort_ip_address_list(&list)
        })?,
    )?;
    globals.set(
        "__alert",
        Function::new(ctx.clone(), |message: String| {
            let shown: String = message
                .chars()
                .take(512)
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            tracing::info!("PAC alert: {shown}");
        })?,
    )?;
    Ok(())
}

/// One helper lookup through the mediator's resolver: names are canonicalised first (an
/// invalid name resolves to nothing), at most [`MAX_LOOKUPS`] per evaluation, and the time
/// spent waiting is given back to the CPU budget.
fn resolve(budget: &Budget, env: &HelperEnv, host: &str) -> Vec<IpAddr> {
    let n = budget.lookups.get() + 1;
    budget.lookups.set(n);
    if n > MAX_LOOKUPS {
        tracing::debug!(
            "PAC: more than {MAX_LOOKUPS} lookups in one evaluation; {host:?} unresolved"
        );
        return Vec::new();
    }
    let Ok(canonical) = policy::canonicalize_host(host) else {
        return Vec::new();
    };
    let started = Instant::now();
    let (result, _) = env.handle.block_on(env.resolver.resolve(&canonical));
    budget
        .deadline
        .set(budget.deadline.get() + started.elapsed());
    result.unwrap_or_default()
}

fn join(addrs: &[IpAddr]) -> String {
    addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(";")
}

/// The host's interface addresses (up, not loopback), read with `getifaddrs`; no socket is
/// opened.
fn local_addrs() -> Vec<IpAddr> {
    use nix::net::if_::InterfaceFlags;
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for a in addrs {
        if !a.flags.contains(InterfaceFlags::IFF_UP)
            || a.flags.contains(InterfaceFlags::IFF_LOOPBACK)
        {
            continue;
        }
        let Some(addr) = a.address else { continue };
        let ip = if let Some(v4) = addr.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            IpAddr::V6(v6.ip())
        } else {
            continue;
        };
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    out
}

/// `isInNetEx(ipAddress, ipPrefix)` as Chromium defines it: the address must be an IP
/// literal (no lookup), the prefix `addr/len` (IPv4 or IPv6).
fn is_in_net_ex(ip: &str, prefix: &str) -> bool {
    let (Ok(ip), Ok(net)) = (ip.trim().parse::<IpAddr>(), prefix.trim().parse::<IpNet>()) else {
        return false;
    };
    net.contains(&ip)
}

/// `sortIpAddressList(list)` as Chromium defines it: `;`-separated literals, IPv6 before
/// IPv4, each ascending; `None` (JS `false`) when any entry is not an IP literal.
fn sort_ip_address_list(list: &str) -> Option<String> {
    let mut addrs = list
        .split(';')
        .map(|s| s.trim().parse::<IpAddr>().ok())
        .collect::<Option<Vec<_>>>()?;
    if addrs.is_empty() {
        return None;
    }
    addrs.sort_by_key(|ip| (ip.is_ipv4(), *ip));
    Some(join(&addrs))
}

#[cfg(test)]
mod tests;
