//! The members' network: each member in a network namespace of its own, joined to the
//! harness by a veth pair on one bridge, so each has its own address and its peer traffic
//! crosses links the harness can cut. Faults are nftables/iptables rules inside a member's
//! namespace, by the address of the other end: a drop in one direction only (an asymmetric
//! partition), both directions (a partition), or a share of packets at random (a lossy link,
//! which TCP turns into delays by retransmitting). Client traffic comes from the bridge's
//! own address and is never cut, as a client on a member's side of a partition would see it.

use std::process::Command;

/// A harness network: a bridge and one namespace per member, removed when dropped.
#[derive(Debug)]
pub struct Net {
    prefix: String,
    subnet: u8,
    members: usize,
}

/// Runs a command; its stderr in the error if it fails.
pub fn run(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

impl Net {
    /// Sets up `members` namespaces named `<prefix>m<i>` on bridge `<prefix>br`, addresses
    /// 10.77.`subnet`.0/24 (the bridge .1, member i .(10 + i)). Leftovers of an earlier run
    /// with the same prefix are removed first.
    pub fn new(prefix: &str, subnet: u8, members: usize) -> Result<Net, String> {
        let net = Net {
            prefix: prefix.to_string(),
            subnet,
            members,
        };
        net.remove();
        let bridge = net.bridge();
        run(&["ip", "link", "add", &bridge, "type", "bridge"])?;
        run(&["ip", "addr", "add", &format!("10.77.{subnet}.1/24"), "dev", &bridge])?;
        run(&["ip", "link", "set", &bridge, "up"])?;
        for i in 0..members {
            let ns = net.namespace(i);
            let veth = format!("{prefix}v{i}");
            run(&["ip", "netns", "add", &ns])?;
            run(&[
                "ip", "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ])?;
            run(&["ip", "link", "set", &veth, "master", &bridge, "up"])?;
            run(&[
                "ip",
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", net.address(i)),
                "dev",
                "eth0",
            ])?;
            run(&["ip", "-n", &ns, "link", "set", "eth0", "up"])?;
            run(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    fn bridge(&self) -> String {
        format!("{}br", self.prefix)
    }

    /// Member `i`'s namespace.
    pub fn namespace(&self, i: usize) -> String {
        format!("{}m{i}", self.prefix)
    }

    /// Member `i`'s address.
    pub fn address(&self, i: usize) -> String {
        format!("10.77.{}.{}", self.subnet, 10 + i)
    }

    /// Drops what member `from` sends to member `to` (at `to`'s end), all of it or a share.
    pub fn drop_from(&self, from: usize, to: usize, share: Option<f64>) -> Result<(), String> {
        let ns = self.namespace(to);
        let source = self.address(from);
        let mut args = vec!["ip", "netns", "exec", &ns, "iptables", "-A", "INPUT", "-s", &source];
        let probability;
        if let Some(p) = share {
            probability = format!("{p:.2}");
            args.extend(["-m", "statistic", "--mode", "random", "--probability", &probability]);
        }
        args.extend(["-j", "DROP"]);
        run(&args)
    }

    /// Removes every rule: all links whole again.
    pub fn heal(&self) -> Result<(), String> {
        for i in 0..self.members {
            run(&["ip", "netns", "exec", &self.namespace(i), "iptables", "-F", "INPUT"])?;
        }
        Ok(())
    }

    fn remove(&self) {
        for i in 0..self.members.max(5) {
            let _ = run(&["ip", "netns", "del", &self.namespace(i)]);
        }
        let _ = run(&["ip", "link", "del", &self.bridge()]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.remove();
    }
}
