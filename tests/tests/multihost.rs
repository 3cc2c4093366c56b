//! Jobs across "hosts" that share no loopback: each node runs in its own network namespace, and
//! the namespaces reach each other only through a Linux bridge in a fourth ("switch") namespace.
//!
//! ```text
//!   host ns h0 (10.213.k.1)   h1 (10.213.k.2)   h2 (10.213.k.3)
//!          eth0                  eth0              eth0
//!           |  veth               |                 |
//!   switch ns:  p0 ---------- br0 --- p1 ---------- p2
//! ```
//!
//! Needs root and iproute2; without them (or when the kernel refuses namespaces, bridges or veths)
//! each test prints `skipping: <why>` and passes. Set `TMK_REQUIRE_NETNS=1` to make that a failure.
//! The namespaces are deleted when a test ends, however it ends; any left by a test process that
//! was killed are deleted by the next run.

mod support;

use std::net::Ipv4Addr;
use std::process::Command;
use std::time::Duration;
use support::{Job, Outcome, heap_base};

/// Every namespace these tests create starts with this, followed by the test process id.
const PREFIX: &str = "tmkt";

/// Where rank 0 listens, on its host's address: the namespace is ours, so any port is free.
const ROOT_PORT: u16 = 7391;

/// Bound on one node of one job (they take well under a second).
const NODE_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `ip <args>`; on failure says which command failed, how, and what it printed.
fn ip(args: &[&str]) -> Result<String, String> {
    let cmd = format!("ip {}", args.join(" "));
    let out = Command::new("ip").args(args).output().map_err(|e| format!("cannot run `{cmd}`: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("`{cmd}` failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// A virtual LAN of `hosts` namespaces on one bridge. Dropping it deletes every namespace it made,
/// which also removes their veths and the bridge.
#[derive(Debug)]
struct Lan {
    /// Namespaces created so far, in creation order (the switch first).
    created: Vec<String>,
    /// The host namespaces, by rank.
    hosts: Vec<String>,
    /// Each host's address, by rank.
    addrs: Vec<Ipv4Addr>,
    /// Directories of per-namespace files made so far (`/etc/netns/<ns>`).
    etc: Vec<String>,
}

impl Lan {
    /// Builds the LAN, or says why this environment cannot (the caller skips).
    fn build(slot: u8, nhosts: u8) -> Result<Lan, String> {
        if effective_uid() != Some(0) {
            return Err("network namespaces need root".into());
        }
        ip(&["-V"])?;
        remove_stale_namespaces();
        let pid = std::process::id();
        let tag = format!("{PREFIX}{pid}s{slot}");
        // The subnet only has to be unique on our own bridge; derive it from the process anyway,
        // so that addresses seen in a failure message point at the run that used them.
        let subnet = (pid % 127) as u8 * 2 + slot % 2 + 1;
        let mut lan = Lan { created: Vec::new(), hosts: Vec::new(), addrs: Vec::new(), etc: Vec::new() };
        let switch = format!("{tag}-sw");
        lan.add_namespace(&switch)?;
        ip(&["-n", &switch, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &switch, "link", "set", "br0", "up"])?;
        for r in 0..nhosts {
            let host = format!("{tag}-h{r}");
            let port = format!("p{r}");
            let addr = Ipv4Addr::new(10, 213, subnet, r + 1);
            lan.add_namespace(&host)?;
            ip(&[
                "-n", &switch, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &host,
            ])?;
            ip(&["-n", &switch, "link", "set", &port, "master", "br0", "up"])?;
            ip(&["-n", &host, "addr", "add", &format!("{addr}/24"), "dev", "eth0"])?;
            ip(&["-n", &host, "link", "set", "eth0", "up"])?;
            // Running a program inside must work too (it mounts a private /sys, which some
            // containers forbid).
            ip(&["netns", "exec", &host, "true"])?;
            lan.hosts.push(host);
            lan.addrs.push(addr);
        }
        Ok(lan)
    }

    /// Creates namespace `name` with its loopback up, and owns it from then on.
    fn add_namespace(&mut self, name: &str) -> Result<(), String> {
        ip(&["netns", "add", name])?;
        self.created.push(name.to_string());
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        Ok(())
    }

    /// Gives each host's resolver a name: `addrs[r]` are the addresses host `r`'s `/etc/hosts`
    /// maps `name` to, in order (`ip netns exec` mounts `/etc/netns/<ns>/hosts` over it).
    fn name_host(&mut self, name: &str, addrs: &[Vec<std::net::IpAddr>]) -> Result<(), String> {
        for (host, addrs) in self.hosts.iter().zip(addrs) {
            let dir = format!("/etc/netns/{host}");
            self.etc.push(dir.clone());
            std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {dir}: {e}"))?;
            let lines: String = addrs.iter().map(|a| format!("{a} {name}\n")).collect();
            let hosts = format!("127.0.0.1 localhost\n{lines}");
            std::fs::write(format!("{dir}/hosts"), hosts)
                .map_err(|e| format!("cannot write {dir}/hosts: {e}"))?;
        }
        Ok(())
    }

    /// Runs `scenario` with node `r` on host `r`, every node printing its statistics. Returns
    /// what each node printed, by rank, once all have finished.
    fn run(&self, backend: &str, scenario: &str, slot: u64) -> Vec<Outcome> {
        self.run_with_root(backend, scenario, slot, &format!("{}:{ROOT_PORT}", self.addrs[0]))
    }

    /// [`Lan::run`], the nodes meeting node 0 at `root`.
    fn run_with_root(&self, backend: &str, scenario: &str, slot: u64, root: &str) -> Vec<Outcome> {
        self.run_with_roots(backend, scenario, slot, &vec![root.to_string(); self.hosts.len()])
    }

    /// [`Lan::run`], node `r` meeting node 0 at `roots[r]`.
    fn run_with_roots(&self, backend: &str, scenario: &str, slot: u64, roots: &[String]) -> Vec<Outcome> {
        let n = self.hosts.len().to_string();
        let jobs: Vec<Job> = self
            .hosts
            .iter()
            .enumerate()
            .map(|(rank, host)| {
                let mut cmd = Command::new("ip");
                cmd.args(["netns", "exec", host, env!("CARGO_BIN_EXE_tmk-testnode"), scenario])
                    .env("TMK_FAULTS", backend)
                    .env("TMK_NPROCS", &n)
                    .env("TMK_RANK", rank.to_string())
                    .env("TMK_ROOT", &roots[rank])
                    .env("TMK_HEAP_SIZE", "64MiB")
                    .env("TMK_HEAP_BASE", heap_base(slot))
                    .env("TMK_CONNECT_TIMEOUT", "20")
                    .env("TMK_STATS", "1");
                Job::spawn(cmd)
            })
            .collect();
        // Waiting in rank order is fine: each wait is bounded, and a panic kills the rest on drop.
        jobs.into_iter().map(|job| job.wait(NODE_TIMEOUT)).collect()
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for dir in &self.etc {
            let _ = std::fs::remove_dir_all(dir);
        }
        for name in self.created.iter().rev() {
            if let Err(e) = ip(&["netns", "delete", name]) {
                eprintln!("warning: {e}");
            }
        }
    }
}

/// This process's effective user id (`Uid:` in /proc/self/status is real, effective, ...).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Deletes namespaces named by [`PREFIX`] whose test process is gone (it was killed before its
/// guard could run).
fn remove_stale_namespaces() {
    let Ok(list) = ip(&["netns", "list"]) else { return };
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(rest) = name.strip_prefix(PREFIX) else { continue };
        let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let ours = rest[pid.len()..].starts_with('s');
        if ours && !pid.is_empty() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "delete", name]);
            let _ = std::fs::remove_dir_all(format!("/etc/netns/{name}"));
        }
    }
}

/// The LAN, or `None` after printing why the test is skipped.
fn lan_or_skip(slot: u8, nhosts: u8) -> Option<Lan> {
    match Lan::build(slot, nhosts) {
        Ok(lan) => Some(lan),
        Err(why) if std::env::var("TMK_REQUIRE_NETNS").is_ok_and(|v| v == "1") => {
            panic!("TMK_REQUIRE_NETNS=1 but network namespaces are unavailable: {why}")
        }
        Err(why) => {
            eprintln!("skipping: {why}");
            None
        }
    }
}

/// Messages node `rank` sent to and received from `peer`, from its `TMK_STATS` report.
fn traffic(out: &Outcome, rank: usize, peer: usize) -> (u64, u64) {
    let header = format!("treadmarks statistics, node {rank} of ");
    assert!(out.stderr.contains(&header), "node {rank} printed no statistics: {out:#?}");
    let label = format!("peer node {peer} ");
    let Some(line) = out.stderr.lines().find(|l| l.trim_start().starts_with(&label)) else {
        return (0, 0);
    };
    let nums: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    // `peer node P  sent  bytes  received  bytes`: the first number is P itself.
    assert_eq!(nums.len(), 5, "unexpected statistics line {line:?}");
    (nums[1], nums[3])
}

/// Runs `scenario` across the LAN and checks that it passed and that each pair in `pairs` of
/// nodes, each in its own namespace, exchanged messages both ways.
fn run_across(lan: &Lan, scenario: &str, slot: u64, pairs: &[(usize, usize)]) {
    for backend in support::backends() {
        run_across_on(lan, backend, scenario, slot, pairs);
    }
}

/// [`run_across`] on one fault backend.
fn run_across_on(lan: &Lan, backend: &str, scenario: &str, slot: u64, pairs: &[(usize, usize)]) {
    let outs = lan.run(backend, scenario, slot);
    outs[0].assert_pass(scenario);
    for (rank, out) in outs.iter().enumerate() {
        assert_eq!(out.code, Some(0), "node {rank} on {} failed: {out:#?}", lan.hosts[rank]);
    }
    let mut talked = Vec::new();
    for &(a, b) in pairs {
        for (me, peer) in [(a, b), (b, a)] {
            let (sent, received) = traffic(&outs[me], me, peer);
            assert!(
                sent > 0 && received > 0,
                "node {me} ({}) and node {peer} ({}) must have talked over the bridge: sent {sent}, \
                 received {received}\n{:#?}",
                lan.addrs[me],
                lan.addrs[peer],
                outs[me]
            );
            talked.push(format!("{me}->{peer}: {sent}"));
        }
    }
    let slowest = outs.iter().map(|o| o.elapsed).max().unwrap_or_default();
    eprintln!(
        "{scenario} on {backend} across {:?}: slowest node took {slowest:?}; messages {}",
        lan.addrs,
        talked.join(", ")
    );
}

#[test]
fn three_hosts_on_a_bridge_count_under_one_lock() {
    let Some(lan) = lan_or_skip(0, 3) else { return };
    // Every node meets node 0 at least at the barrier.
    run_across(&lan, "counter", 20, &[(0, 1), (0, 2)]);
}

#[test]
fn three_hosts_on_a_bridge_merge_interleaved_words() {
    let Some(lan) = lan_or_skip(1, 3) else { return };
    // After each barrier every node fetches the other two's diffs of the shared page: every pair
    // talks, including 1 and 2 over the mesh link that neither made through node 0.
    run_across(&lan, "interleaved", 21, &[(0, 1), (0, 2), (1, 2)]);
}

/// The hosts named by a host name whose own resolver maps it to a loopback address, as Debian's
/// and Ubuntu's `/etc/hosts` map the host's name to 127.0.1.1, while the others' resolvers give its
/// network address: node 0 listened on 127.0.1.1, and the others failed at the meeting's timeout.
/// The others' resolvers give an address first where nothing answers (a name with an IPv6 and
/// an IPv4 address, one of them unusable): they took only the first, and timed out on it.
#[test]
fn a_root_named_by_a_host_whose_own_name_is_loopback_is_reached() {
    let Some(mut lan) = lan_or_skip(2, 3) else { return };
    let name = "tmk-root-host";
    // Node 0's host gets a second address, which the others' resolvers sort after one where
    // nobody answers (glibc prefers the address sharing the longer prefix with the source:
    // .77 = 0b0100_1101 shares 25 bits with .2 and .3, .129 = 0b1000_0001 only 24).
    let [a, b, c, _] = lan.addrs[0].octets();
    let (nobody, second) = (Ipv4Addr::new(a, b, c, 77), Ipv4Addr::new(a, b, c, 129));
    if let Err(why) = ip(&["-n", &lan.hosts[0], "addr", "add", &format!("{second}/24"), "dev", "eth0"]) {
        eprintln!("skipping: {why}");
        return;
    }
    let mut addrs: Vec<Vec<std::net::IpAddr>> = vec![vec![second.into(), nobody.into()]; lan.hosts.len()];
    addrs[0] = vec![Ipv4Addr::new(127, 0, 1, 1).into()];
    if let Err(why) = lan.name_host(name, &addrs) {
        eprintln!("skipping: {why}");
        return;
    }
    let outs = lan.run_with_root(support::backends()[0], "counter", 22, &format!("{name}:{ROOT_PORT}"));
    outs[0].assert_pass("counter");
    for (rank, out) in outs.iter().enumerate() {
        assert_eq!(out.code, Some(0), "node {rank} on {} failed: {out:#?}", lan.hosts[rank]);
    }
    let everywhere = ["node 0 listens on [::]:7391", "node 0 listens on 0.0.0.0:7391"];
    assert!(everywhere.iter().any(|l| outs[0].stderr.contains(l)), "{:#?}", outs[0]);
    for out in &outs[1..] {
        assert!(!out.stderr.contains(&nobody.to_string()), "{out:#?}");
    }
}

/// Hosts that share only an IPv6 link meet over link-local addresses, each naming node 0's with
/// its own interface (`[fe80::1%<index>]`): a member bound its listener without the interface,
/// which the kernel refuses, and the table that tells the others where it listens carries no
/// interface either.
#[test]
fn three_hosts_meet_over_ipv6_link_local_addresses() {
    let Some(lan) = lan_or_skip(3, 3) else { return };
    let mut roots = Vec::new();
    for (r, host) in lan.hosts.iter().enumerate() {
        let own = format!("fe80::{}/64", r + 1);
        let index = ip(&["-n", host, "addr", "add", &own, "dev", "eth0", "nodad"])
            .and_then(|_| ip(&["-n", host, "-o", "link", "show", "eth0"]))
            .map(|link| link.split(':').next().unwrap_or_default().trim().to_string());
        match index {
            Ok(index) if !index.is_empty() => roots.push(format!("[fe80::1%{index}]:{ROOT_PORT}")),
            other => {
                eprintln!("skipping: no IPv6 link-local address on {host}: {other:?}");
                return;
            }
        }
    }
    let outs = lan.run_with_roots(support::backends()[0], "counter", 23, &roots);
    outs[0].assert_pass("counter");
    for (rank, out) in outs.iter().enumerate() {
        assert_eq!(out.code, Some(0), "node {rank} on {} failed: {out:#?}", lan.hosts[rank]);
    }
}

/// A root named by a host name that the resolver never answers for (its name server's address
/// is a neighbour nobody on the LAN is, so its queries vanish without an error, and the resolver
/// would wait 30 s an attempt): the node gives up at the meeting's bound, naming the setting,
/// instead of waiting for the resolver.
#[test]
fn a_root_name_nobody_answers_for_fails_at_the_meetings_bound() {
    let Some(mut lan) = lan_or_skip(4, 1) else { return };
    let host = lan.hosts[0].clone();
    let [a, b, c, _] = lan.addrs[0].octets();
    let server = Ipv4Addr::new(a, b, c, 99).to_string();
    let mac = "02:00:00:00:00:99";
    ip(&["-n", &host, "neigh", "add", &server, "lladdr", mac, "dev", "eth0", "nud", "permanent"]).unwrap();
    lan.name_host("unrelated", &[vec![lan.addrs[0].into()]]).unwrap();
    let conf = format!("nameserver {server}\noptions timeout:30 attempts:2\n");
    std::fs::write(format!("/etc/netns/{host}/resolv.conf"), conf).unwrap();
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &host, env!("CARGO_BIN_EXE_tmk-testnode"), "counter"])
        .env("TMK_NPROCS", "2")
        .env("TMK_RANK", "1")
        .env("TMK_ROOT", "tmk-nobody-answers.example:7391")
        .env("TMK_HEAP_SIZE", "64MiB")
        .env("TMK_HEAP_BASE", heap_base(24))
        .env("TMK_CONNECT_TIMEOUT", "2");
    let out = Job::spawn(cmd).wait(NODE_TIMEOUT);
    assert_ne!(out.code, Some(0), "{out:#?}");
    assert!(out.stderr.contains("TMK_ROOT") && out.stderr.contains("did not resolve within 2 s"), "{out:#?}");
}
