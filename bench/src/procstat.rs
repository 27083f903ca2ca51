//! CPU time and memory of a process tree, read from `/proc` (Linux).

use std::collections::HashMap;
use std::fs;

use anyhow::Context;

/// Ticks per second of the `utime`/`stime` fields of `/proc/PID/stat`.
fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions; it only reads a constant of the C library.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// The fields of `/proc/PID/stat` after the command name, which may itself hold spaces and
/// parentheses (so the split is at the last `)`).
fn stat_fields(pid: u32) -> anyhow::Result<Vec<u64>> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let rest = text
        .rfind(')')
        .map(|i| &text[i + 1..])
        .context("malformed /proc/PID/stat")?;
    // Field 3 (state) is a letter: keep a placeholder so that indexes stay those of proc(5)
    // minus 3.
    Ok(rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect())
}

/// `pid` and every live descendant of it.
pub fn process_tree(pid: u32) -> Vec<u32> {
    let mut parent: HashMap<u32, u32> = HashMap::new();
    if let Ok(dir) = fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(p) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            if let Ok(f) = stat_fields(p)
                && let Some(&ppid) = f.get(1)
            {
                parent.insert(p, ppid as u32);
            }
        }
    }
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let me = out[i];
        out.extend(parent.iter().filter(|&(_, &pp)| pp == me).map(|(&c, _)| c));
        i += 1;
    }
    out
}

/// CPU seconds (user + system, including reaped children) used so far by `pid` and its
/// live descendants.
///
/// # Errors
/// When `/proc/PID/stat` of `pid` itself cannot be read (the process is gone).
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let ticks = clock_ticks();
    let mut total = 0u64;
    for (n, p) in process_tree(pid).into_iter().enumerate() {
        let f = match stat_fields(p) {
            Ok(f) => f,
            Err(e) if n == 0 => return Err(e),
            Err(_) => continue,
        };
        // proc(5): utime 14, stime 15, cutime 16, cstime 17 (1-based); here minus 3.
        total += f.get(11..15).map_or(0, |s| s.iter().sum());
    }
    Ok(total as f64 / ticks)
}

/// Memory of a process tree, in KiB, summed over its processes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Memory {
    /// Resident set size now (`VmRSS`).
    pub rss_kib: u64,
    /// Peak resident set size (`VmHWM`).
    pub hwm_kib: u64,
}

/// `VmRSS` and `VmHWM` of `pid` and its live descendants.
///
/// # Errors
/// When `/proc/PID/status` of `pid` itself cannot be read.
pub fn memory(pid: u32) -> anyhow::Result<Memory> {
    let mut total = Memory::default();
    for (n, p) in process_tree(pid).into_iter().enumerate() {
        let text = match fs::read_to_string(format!("/proc/{p}/status")) {
            Ok(t) => t,
            Err(e) if n == 0 => return Err(e).context(format!("reading /proc/{p}/status")),
            Err(_) => continue,
        };
        for line in text.lines() {
            let field = |prefix: &str| {
                line.strip_prefix(prefix)
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            };
            if let Some(v) = field("VmRSS:") {
                total.rss_kib += v;
            } else if let Some(v) = field("VmHWM:") {
                total.hwm_kib += v;
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process() {
        let me = std::process::id();
        let m = memory(me).unwrap();
        assert!(m.rss_kib > 0 && m.hwm_kib >= m.rss_kib);
        assert!(cpu_seconds(me).unwrap() >= 0.0);
        assert_eq!(process_tree(me)[0], me);
    }
}
