//! The end-to-end suite's harness on `libtest-mimic` (so `--list`, filters, `--exact`,
//! `--ignored` and `--test-threads` work as with libtest): each [`Case`] is one async test
//! with the [`Tool`]s it needs, run on a multi-threaded tokio runtime of its own.
//!
//! A case whose tools this machine lacks is reported *ignored*, with the packages to
//! install in its reason; under `CI=true` it *fails* instead, so CI can never skip quietly.
//! Never an early return that passes.

use std::future::Future;
use std::pin::Pin;

use libtest_mimic::{Arguments, Completion, Failed, Trial};

use crate::tool::{self, Tool};

/// The future of one test.
pub type Boxed = Pin<Box<dyn Future<Output = anyhow::Result<()>>>>;

/// A test function, as [`case!`](crate::case) makes it.
pub type TestFn = fn() -> Boxed;

/// One test: its name, body, declared tools and runtime size.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    name: &'static str,
    run: TestFn,
    needs: &'static [Tool],
    threads: usize,
}

/// `case!(f)`: the async test function `f` of this module as a [`Case`] named
/// `module::f` (the test binary's name left out), needing no tool, on 2 worker threads.
#[macro_export]
macro_rules! case {
    ($f:ident) => {
        $crate::harness::Case::new(
            concat!(module_path!(), "::", stringify!($f)),
            (|| -> $crate::harness::Boxed { ::std::boxed::Box::pin($f()) })
                as $crate::harness::TestFn,
        )
    };
}

impl Case {
    /// A case named `path` (`e2e::area::name`: the first segment is dropped).
    pub fn new(path: &'static str, run: TestFn) -> Self {
        Self {
            name: path.split_once("::").map_or(path, |(_, rest)| rest),
            run,
            needs: &[],
            threads: 2,
        }
    }

    /// The tools this test runs.
    #[must_use]
    pub fn needs(mut self, tools: &'static [Tool]) -> Self {
        self.needs = tools;
        self
    }

    /// The number of the runtime's worker threads (default 2).
    #[must_use]
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = n;
        self
    }

    /// The test's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The trial libtest-mimic runs: ignored (or failed under CI) when a tool is missing.
    fn trial(self, ci: bool) -> Trial {
        let mut packages: Vec<&str> = self
            .needs
            .iter()
            .flat_map(|t| t.missing_packages())
            .collect();
        packages.sort_unstable();
        packages.dedup();
        if !packages.is_empty() {
            let list = packages.join(" ");
            let reason = format!(
                "needs the package(s) {list}: sudo apt-get install {list} (`sudo .ci/deps` installs all the suite needs)"
            );
            return Trial::ignorable_test(self.name, move || {
                if ci {
                    Err(Failed::from(format!(
                        "CI=true, and this machine lacks {list}, which this test needs: CI never skips; install it (.ci/deps)"
                    )))
                } else {
                    Ok(Completion::ignored_with(reason))
                }
            });
        }
        Trial::test(self.name, move || self.run_now())
    }

    fn run_now(self) -> Result<(), Failed> {
        let (name, needs) = (self.name, self.needs);
        tool::declare(name, needs);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(self.threads)
            .enable_all()
            .on_thread_start(move || tool::declare(name, needs))
            .build()
            .map_err(|e| Failed::from(format!("building the test's runtime: {e}")))?;
        let result = rt.block_on((self.run)());
        // Whatever the test left running ends with its runtime, not later in another's.
        rt.shutdown_timeout(std::time::Duration::from_secs(10));
        result.map_err(|e| Failed::from(format!("Error: {e:?}")))?;
        let unused = tool::declared_but_unused(name, needs);
        if unused.is_empty() {
            Ok(())
        } else {
            Err(Failed::from(format!(
                "{name} declares {unused:?} but never ran them: drop them from its needs"
            )))
        }
    }
}

/// Whether this run is CI's (`CI=true`, as `.ci/run` and most CI services set it).
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Runs `cases` as the test binary's `main` does and exits with libtest's status.
pub fn run(cases: Vec<Case>) -> ! {
    let args = Arguments::from_args();
    let ci = ci();
    let mut names = std::collections::HashSet::new();
    for c in &cases {
        assert!(names.insert(c.name), "two cases are named {}", c.name);
    }
    let trials = cases.into_iter().map(|c| c.trial(ci)).collect();
    libtest_mimic::run(&args, trials).exit()
}
