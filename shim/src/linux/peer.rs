//! Which program of the sandbox holds one TCP connection, read from `/proc` while the
//! connection is open: the connection's socket in the sandbox's network namespace (its
//! `net/tcp`, as a process of the sandbox sees it), then the process among the shim's
//! descendants that holds that socket, named by its `comm` (the first word: `npm
//! install` is `npm`). For the line that tells a client it does not trust the mediator's
//! CA (`crate::rejected`).
//!
//! Observation only, and best effort: `None` when any step cannot be read (a process
//! gone, a `/proc` that hides others).

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The program of the sandbox whose socket's local address is `client` and remote
/// address `server` (a connection to the shim's proxy listener, or a captured one).
pub(crate) fn program_of(client: SocketAddr, server: SocketAddr) -> Option<String> {
    let tree = descendants(std::process::id());
    let inode = tree
        .iter()
        .find_map(|pid| socket_inode(*pid, client, server))?;
    let link = format!("socket:[{inode}]");
    let holder = tree.iter().find(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
            fds.flatten().any(|fd| {
                std::fs::read_link(fd.path())
                    .is_ok_and(|target| target.as_os_str() == link.as_str())
            })
        })
    })?;
    let comm = std::fs::read_to_string(format!("/proc/{holder}/comm")).ok()?;
    comm.split_whitespace().next().map(str::to_owned)
}

/// The processes below `root`, nearest first (from every `/proc/<pid>/stat`'s ppid).
fn descendants(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(ppid) = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|stat| parent_of(&stat))
        {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut out = Vec::new();
    let mut next = VecDeque::from([root]);
    while let Some(pid) = next.pop_front() {
        for &child in children.get(&pid).into_iter().flatten() {
            out.push(child);
            next.push_back(child);
        }
    }
    out
}

/// The ppid of a `/proc/<pid>/stat` line: the fourth field, after the `(comm)` that may
/// hold spaces and parentheses itself.
fn parent_of(stat: &str) -> Option<u32> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// The inode of the socket `local` -> `remote` in the network namespace of `pid`.
fn socket_inode(pid: u32, local: SocketAddr, remote: SocketAddr) -> Option<u64> {
    let table = match local.ip() {
        IpAddr::V4(_) => "tcp",
        IpAddr::V6(_) => "tcp6",
    };
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).ok()?;
    find_inode(&text, local, remote)
}

/// The inode of the row of a `net/tcp` or `net/tcp6` table whose local and remote
/// addresses are `local` and `remote`.
fn find_inode(table: &str, local: SocketAddr, remote: SocketAddr) -> Option<u64> {
    table.lines().skip(1).find_map(|row| {
        let fields: Vec<&str> = row.split_whitespace().collect();
        let (l, r) = (parse_addr(fields.get(1)?)?, parse_addr(fields.get(2)?)?);
        (l == local && r == remote)
            .then(|| fields.get(9)?.parse().ok())
            .flatten()
    })
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6): the kernel prints each
/// 32-bit word of the address as a number in the host's byte order, the port as a
/// number.
fn parse_addr(field: &str) -> Option<SocketAddr> {
    let (addr, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let hex = addr.get(i * 8..i * 8 + 8)?;
        Some(u32::from_str_radix(hex, 16).ok()?.to_ne_bytes())
    };
    let ip = match addr.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_of_this_process_names_this_program() {
        // A connection of this process: the lookup over this process as the root's only
        // descendant is what the shim does over the sandbox's processes.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (local, remote) = (c.local_addr().unwrap(), c.peer_addr().unwrap());
        let me = std::process::id();
        let inode = socket_inode(me, local, remote).expect("the socket in net/tcp");
        let link = format!("socket:[{inode}]");
        let held = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == link.as_str()));
        assert!(held, "this process holds {link}");
        assert!(
            socket_inode(me, remote, local).is_some(),
            "the other end too"
        );
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn proc_lines_are_read() {
        assert_eq!(
            parse_addr("0100007F:1F90"),
            Some("127.0.0.1:8080".parse().unwrap())
        );
        let v6 = parse_addr("00000000000000000000000001000000:0050").unwrap();
        assert_eq!(v6, "[::1]:80".parse().unwrap());
        assert_eq!(parent_of("12 (a) b) S 7 12 12 0"), Some(7));
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 20 4 30 10 -1\n";
        assert_eq!(
            find_inode(
                table,
                "127.0.0.1:8080".parse().unwrap(),
                "127.0.0.1:50000".parse().unwrap()
            ),
            Some(4242)
        );
    }
}
