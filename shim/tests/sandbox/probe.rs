//! The probe: this binary's other role, as the confined command. Each probe makes one
//! system call (or reads one kernel view) and prints its result on one line: `ok`, or the
//! errno name (`err:EROFS`), so that the tests assert exact errnos instead of parsing
//! shell error messages.
//!
//! It runs inside the sandbox and must never judge what it sees: the driver does.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{CA_VARS, SYSTEM_BUNDLES};

fn errno_result<T>(r: std::io::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => match e.raw_os_error() {
            Some(n) => format!("err:{:?}", nix::errno::Errno::from_raw(n)),
            None => format!("err:{e}"),
        },
    }
}

fn nix_result<T>(r: nix::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("err:{e:?}"),
    }
}

/// Run the probe `args[0]` with its arguments, print its result; the exit status is 0.
#[expect(
    clippy::too_many_lines,
    reason = "one match arm per probe the tests ask for"
)]
pub(crate) fn main(args: &[String]) -> i32 {
    let a = |i: usize| args.get(i).cloned().unwrap_or_default();
    let out = match a(0).as_str() {
        "write" => errno_result(
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(a(1))
                .and_then(|mut f| f.write_all(b"pwned")),
        ),
        "append" => errno_result(
            std::fs::OpenOptions::new()
                .append(true)
                .open(a(1))
                .and_then(|mut f| f.write_all(b"x")),
        ),
        "read" => errno_result(std::fs::read(a(1))),
        // The result of reading each path, in order, space-separated.
        "read-each" => args[1..]
            .iter()
            .map(|p| errno_result(std::fs::read(p)))
            .collect::<Vec<_>>()
            .join(" "),
        "link" => errno_result(std::fs::hard_link(a(1), a(2))),
        // The uid and gid the command has inside, and its supplementary groups.
        "ids" => format!(
            "{} {} {:?}",
            nix::unistd::getuid(),
            nix::unistd::getgid(),
            nix::unistd::getgroups().unwrap_or_default()
        ),
        // chmod to an octal mode; create a file with an octal mode (open, O_TMPFILE).
        "chmod-mode" => errno_result(std::fs::set_permissions(
            a(1),
            std::fs::Permissions::from_mode(u32::from_str_radix(&a(2), 8).unwrap()),
        )),
        "create-mode" | "tmpfile-mode" => {
            use std::os::unix::fs::OpenOptionsExt;
            let mut o = std::fs::OpenOptions::new();
            o.write(true).mode(u32::from_str_radix(&a(2), 8).unwrap());
            if a(0) == "create-mode" {
                o.create_new(true);
            } else {
                o.custom_flags(libc::O_TMPFILE);
            }
            errno_result(o.open(a(1)))
        }
        "mkdir" => errno_result(std::fs::create_dir(a(1))),
        "rename" => errno_result(std::fs::rename(a(1), a(2))),
        "remove" => errno_result(std::fs::remove_file(a(1))),
        "chmod" => errno_result(std::fs::set_permissions(
            a(1),
            std::fs::Permissions::from_mode(0o666),
        )),
        "socket-unix" => nix_result(nix::sys::socket::socket(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::Stream,
            nix::sys::socket::SockFlag::empty(),
            None,
        )),
        "socketpair" => nix_result(nix::sys::socket::socketpair(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::Stream,
            None,
            nix::sys::socket::SockFlag::empty(),
        )),
        "connect-unix" => errno_result(std::os::unix::net::UnixStream::connect(a(1))),
        "unshare-user" => nix_result(nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER)),
        "unshare-net" => nix_result(nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)),
        "io-uring" => {
            let mut params = [0u8; 120];
            // SAFETY: io_uring_setup reads/writes our 120-byte params buffer only.
            let rc = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4, params.as_mut_ptr()) };
            if rc < 0 {
                format!("err:{:?}", nix::errno::Errno::last())
            } else {
                "ok".into()
            }
        }
        "clone3" => {
            // SAFETY: a NULL clone_args with size 0 makes no memory access; only
            // the filter's answer matters.
            let rc = unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize) };
            if rc < 0 {
                format!("err:{:?}", nix::errno::Errno::last())
            } else {
                "ok".into()
            }
        }
        "x32-getpid" => {
            // SAFETY: getpid through the x32 ABI number; takes no arguments.
            let rc = unsafe { libc::syscall(0x4000_0000 | libc::SYS_getpid) };
            format!("returned {rc}")
        }
        "remount-rw" => nix_result(nix::mount::mount(
            None::<&str>,
            "/",
            None::<&str>,
            nix::mount::MsFlags::MS_REMOUNT,
            None::<&str>,
        )),
        "umount" => nix_result(nix::mount::umount2(
            a(1).as_str(),
            nix::mount::MntFlags::MNT_DETACH,
        )),
        "capeff" => std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("Cap") || l.starts_with("NoNewPrivs"))
            .collect::<Vec<_>>()
            .join(" "),
        "ifaces" => {
            let mut v: Vec<String> = std::fs::read_dir("/sys/class/net")
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v.join(",")
        }
        "routes" => {
            // Non-header lines of the kernel's route tables (main table, IPv4 and IPv6).
            let v4 = std::fs::read_to_string("/proc/net/route")
                .unwrap_or_default()
                .lines()
                .skip(1)
                .count();
            let v6 = std::fs::read_to_string("/proc/net/ipv6_route")
                .unwrap_or_default()
                .lines()
                .filter(|l| !l.contains(" lo"))
                .count();
            format!("v4={v4} v6={v6}")
        }
        "route-ifaces" => {
            // The interfaces any IPv4 or IPv6 route of the main table leaves by (not lo).
            let mut v: Vec<String> = std::fs::read_to_string("/proc/net/route")
                .unwrap_or_default()
                .lines()
                .skip(1)
                .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
                .chain(
                    std::fs::read_to_string("/proc/net/ipv6_route")
                        .unwrap_or_default()
                        .lines()
                        .filter_map(|l| l.split_whitespace().last().map(str::to_owned)),
                )
                .filter(|i| i != "lo")
                .collect();
            v.sort();
            v.dedup();
            v.join(",")
        }
        "connect" => {
            match TcpStream::connect_timeout(&a(1).parse().unwrap(), Duration::from_secs(2)) {
                Ok(_) => "ok".into(),
                Err(e) => errno_result::<()>(Err(e)),
            }
        }
        "dns-burst" => dns_burst(a(1).parse().unwrap_or(0)),
        "pids" => {
            let mut pids: Vec<u32> = std::fs::read_dir("/proc")
                .unwrap()
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect();
            pids.sort();
            format!("{pids:?}")
        }
        "env" => args[1..]
            .iter()
            .map(|k| std::env::var(k).unwrap_or_default())
            .collect::<Vec<_>>()
            .join(" "),
        "echo-via-proxy" => {
            let proxy = std::env::var("HTTP_PROXY").unwrap();
            let addr = proxy.trim_start_matches("http://");
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"ping\n").unwrap();
            let mut line = String::new();
            BufReader::new(s).read_line(&mut line).unwrap();
            line.trim().to_owned()
        }
        "http-via-proxy" => {
            // Absolute-form GET through the proxy; prints the status line.
            let proxy = std::env::var("HTTP_PROXY").unwrap();
            let mut s = TcpStream::connect(proxy.trim_start_matches("http://")).unwrap();
            write!(
                s,
                "GET {} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                a(1)
            )
            .unwrap();
            let mut all = String::new();
            let _ = s.read_to_string(&mut all);
            all.lines().next().unwrap_or_default().to_owned()
        }
        "connect-via-proxy" => {
            // HTTP CONNECT through the proxy; prints the status line.
            let proxy = std::env::var("HTTP_PROXY").unwrap();
            let mut s = TcpStream::connect(proxy.trim_start_matches("http://")).unwrap();
            write!(s, "CONNECT {0} HTTP/1.1\r\nHost: {0}\r\n\r\n", a(1)).unwrap();
            let mut line = String::new();
            let _ = BufReader::new(s).read_line(&mut line);
            line.trim().to_owned()
        }
        "spawn-and-exit" => {
            // Leave a background child (a `sleep` whose argument marks it) and exit.
            Command::new("sleep")
                .arg(a(1))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            "ok".into()
        }
        "ca-check" => {
            // One line per CA variable: unset, or what can be done with the file it names
            // and whether it holds the expected CA (a(1), a PEM file) and the system bundle.
            let squeeze = |b: &[u8]| -> Vec<u8> {
                b.iter()
                    .copied()
                    .filter(|c| !c.is_ascii_whitespace())
                    .collect()
            };
            let want = squeeze(&std::fs::read(a(1)).unwrap());
            let system = SYSTEM_BUNDLES
                .iter()
                .find_map(|p| std::fs::read(p).ok())
                .map(|b| squeeze(&b))
                .unwrap_or_default();
            let contains = |hay: &[u8], needle: &[u8]| {
                !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
            };
            let mut lines = Vec::new();
            for name in CA_VARS {
                let Ok(path) = std::env::var(name) else {
                    lines.push(format!("{name} unset"));
                    continue;
                };
                let body = std::fs::read(&path).map(|b| squeeze(&b));
                let read =
                    errno_result(body.as_ref().map(|_| ()).map_err(|e| {
                        std::io::Error::from_raw_os_error(e.raw_os_error().unwrap_or(0))
                    }));
                let body = body.unwrap_or_default();
                let write = errno_result(
                    std::fs::OpenOptions::new()
                        .append(true)
                        .open(&path)
                        .and_then(|mut f| f.write_all(b"x")),
                );
                let chmod = errno_result(std::fs::set_permissions(
                    &path,
                    std::fs::Permissions::from_mode(0o666),
                ));
                let remove = errno_result(std::fs::remove_file(&path));
                let ca = if body == want {
                    "only"
                } else if body.ends_with(&want) {
                    "last"
                } else {
                    "missing"
                };
                let sys = if body.starts_with(&system) && contains(&system, b"BEGINCERTIFICATE") {
                    "system"
                } else {
                    "no-system"
                };
                lines.push(format!(
                    "{name} read={read} write={write} chmod={chmod} remove={remove} ca={ca} {sys}"
                ));
            }
            lines.join("\n")
        }
        other => format!("unknown probe {other}"),
    };
    println!("{out}");
    0
}

/// `answered K of N`: N A queries (ids 0..N, names `qI.burst.test`) sent back to back from one
/// UDP socket to the resolver `/etc/resolv.conf` names, while another thread counts the
/// distinct ids answered (until 3 s pass without an answer).
fn dns_burst(n: u16) -> String {
    let conf = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let Some(server) = conf
        .lines()
        .find_map(|l| l.strip_prefix("nameserver "))
        .and_then(|a| a.trim().parse::<std::net::IpAddr>().ok())
    else {
        return format!("no nameserver in {conf:?}");
    };
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    socket.connect((server, 53)).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    // Room for the replies while this thread is not scheduled (capped by rmem_max).
    let _ = nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::RcvBuf, &(8 << 20));
    let sender = socket.try_clone().unwrap();
    let send = std::thread::spawn(move || {
        for id in 0..n {
            let mut q = id.to_be_bytes().to_vec();
            q.extend_from_slice(&[1, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
            let label = format!("q{id}");
            q.push(label.len() as u8);
            q.extend_from_slice(label.as_bytes());
            q.extend_from_slice(b"\x05burst\x04test\x00\x00\x01\x00\x01");
            let _ = sender.send(&q);
        }
    });
    let mut seen = vec![false; usize::from(n)];
    let mut buf = [0u8; 1500];
    while let Ok(len) = socket.recv(&mut buf) {
        if len >= 2 {
            let id = usize::from(u16::from_be_bytes([buf[0], buf[1]]));
            if let Some(s) = seen.get_mut(id) {
                *s = true;
            }
        }
        if seen.iter().all(|s| *s) {
            break;
        }
    }
    let _ = send.join();
    format!("answered {} of {n}", seen.iter().filter(|s| **s).count())
}
