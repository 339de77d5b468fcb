//! [`free_local_port`]: a port for a server a test starts on 127.0.0.1.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// The lowest port handed out: below it sit well-known and registered services.
const LOWEST: u32 = 20_000;

/// Advances on every call, so that threads of one process never pick the same port.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// A port on 127.0.0.1 that nothing listens on now, for a server a test is about to start
/// (etcd members, PostgreSQL, chromedriver).
///
/// The port is not held: another process may still take it before the server binds it,
/// and a caller that can see "address already in use" should pick again. Two choices make
/// that unlikely. The port comes from *below* the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`), which the OS gives to every outgoing connection; a
/// port from `bind(":0")` is in that range, so between its release and the server's bind
/// any client connection of the machine can land on it. And the ports of one process
/// follow one another from a start that depends on its pid, so threads and processes
/// running side by side do not walk over the same ports.
#[must_use]
pub fn free_local_port() -> u16 {
    let (low, high) = candidates();
    let span = high - low;
    let start = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let port = low + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let port = u16::try_from(port).expect("candidates are ports");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    // Every candidate is taken: let the OS choose from its ephemeral range.
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("the OS gives out a free port on 127.0.0.1")
}

/// The ports `[low, high)` outside the ephemeral range: below it when it starts high
/// enough (Linux's default is 32768–60999), else above it.
fn candidates() -> (u32, u32) {
    let (ephemeral_low, ephemeral_high) = ephemeral_range().unwrap_or((32_768, 60_999));
    if ephemeral_low >= LOWEST + 1_000 {
        (LOWEST, ephemeral_low)
    } else if ephemeral_high + 1_000 <= 65_535 {
        (ephemeral_high + 1, 65_536)
    } else {
        (LOWEST, 65_536)
    }
}

/// The kernel's ephemeral port range, where it can be read (Linux).
fn ephemeral_range() -> Option<(u32, u32)> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut bounds = text.split_whitespace().map(str::parse::<u32>);
    match (bounds.next(), bounds.next()) {
        (Some(Ok(low)), Some(Ok(high))) if low <= high && high <= 65_535 => Some((low, high)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_bindable_and_outside_the_ephemeral_range() {
        let (low, high) = ephemeral_range().unwrap_or((32_768, 60_999));
        let ports: Vec<u16> = (0..50).map(|_| free_local_port()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(
            unique.len(),
            ports.len(),
            "a port was handed out twice: {ports:?}"
        );
        for port in ports {
            assert!(
                !(low..=high).contains(&u32::from(port)),
                "{port} is in the ephemeral range {low}-{high}"
            );
            TcpListener::bind(("127.0.0.1", port)).expect("the port is free");
        }
    }
}
