//! How much memory a job may still take here: the machine's `MemAvailable`, or less where the
//! memory cgroup this process runs in (or one above it) sets a lower limit, as a container does
//! (its limit less its usage, not counting the inactive page cache the kernel would drop).
//!
//! Invariants: a figure that cannot be read (no `/proc`, no cgroup file, a limit of "max" or
//! the kernel's "no limit" value) limits nothing, so a check built on these never refuses a job
//! for want of information; the tightest limit along the cgroup's path to its root wins.

use std::path::Path;

/// Where the cgroup file systems are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// A cgroup v1 limit at or above this is the kernel's "no limit" (`PAGE_COUNTER_MAX` pages).
const V1_UNLIMITED: u64 = 1 << 62;

/// The memory this process may still take, in bytes, and whose limit that is (for messages): the
/// machine's (`MemAvailable`) or its memory cgroup's (limit less usage), whichever is smaller.
/// `None` if neither can be read.
pub(crate) fn available() -> Option<(u64, String)> {
    let machine = meminfo("MemAvailable:").map(|b| (b, "this machine has available".to_string()));
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let cgroup = cgroup_headroom(&cgroups, Path::new(CGROUP_ROOT))
        .map(|(b, path)| (b, format!("the memory cgroup {path} still allows")));
    match (machine, cgroup) {
        (Some(m), Some(c)) => Some(if c.0 < m.0 { c } else { m }),
        (m, c) => m.or(c),
    }
}

/// A figure of `/proc/meminfo` (`field` with its colon), in bytes, if it can be read.
pub(crate) fn meminfo(field: &str) -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 =
        info.lines().find_map(|l| l.strip_prefix(field))?.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib << 10)
}

/// The least headroom (limit less usage, the page cache the kernel could drop not counted, in
/// bytes) of the memory cgroups on the path of this process's cgroup, given `/proc/self/cgroup`
/// (`proc_cgroup`) and the mount point `root`, and the cgroup whose limit it is. Cgroup v1's
/// memory hierarchy is used where the process has one (it holds the memory controller then),
/// else the unified (v2) one. `None` where no level has a limit.
fn cgroup_headroom(proc_cgroup: &str, root: &Path) -> Option<(u64, String)> {
    let lines: Vec<(&str, &str)> = proc_cgroup
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
            Some((controllers, path))
        })
        .collect();
    let v1 = lines.iter().find(|(c, _)| c.split(',').any(|c| c == "memory"));
    // The limit, the usage, and in `memory.stat` the page cache the kernel would drop rather
    // than refuse memory (counted in the usage: a container that built or read a lot sits near
    // its limit, though a job there would fit).
    let (base, path, [limit_file, usage_file, cache_field]) = match v1 {
        Some(&(_, path)) => (
            root.join("memory"),
            path,
            ["memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"],
        ),
        None => {
            let &(_, path) = lines.iter().find(|(c, _)| c.is_empty())?;
            (root.to_path_buf(), path, ["memory.max", "memory.current", "inactive_file"])
        }
    };
    let read = |dir: &Path, file: &str| std::fs::read_to_string(dir.join(file)).ok();
    let mut tightest: Option<(u64, String)> = None;
    let mut level = path.trim_end_matches('/');
    loop {
        let dir = base.join(level.trim_start_matches('/'));
        let limit =
            read(&dir, limit_file).and_then(|l| l.trim().parse::<u64>().ok()).filter(|&l| l < V1_UNLIMITED);
        if let (Some(limit), Some(usage)) =
            (limit, read(&dir, usage_file).and_then(|u| u.trim().parse::<u64>().ok()))
        {
            let cache = read(&dir, "memory.stat").and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix(cache_field)?.strip_prefix(' ')?.trim().parse::<u64>().ok())
            });
            let room = limit.saturating_sub(usage.saturating_sub(cache.unwrap_or(0)));
            if tightest.as_ref().is_none_or(|t| room < t.0) {
                tightest = Some((room, if level.is_empty() { "/".to_string() } else { level.to_string() }));
            }
        }
        if level.is_empty() {
            return tightest;
        }
        level = &level[..level.rfind('/').unwrap_or(0)];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A fresh directory for one test's fake cgroup tree, with `files` (path, contents) in it.
    fn tree(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let root = std::env::temp_dir().join(format!("treadmarks-headroom-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (path, text) in files {
            let file = root.join(path);
            std::fs::create_dir_all(file.parent().expect("a parent")).expect("mkdir");
            std::fs::write(file, text).expect("write");
        }
        root
    }

    #[test]
    fn the_tightest_v2_limit_on_the_path_wins() {
        let root = tree(
            "v2",
            &[
                ("jobs/memory.max", "1073741824\n"),
                ("jobs/memory.current", "73741824\n"),
                ("jobs/one/memory.max", "max\n"),
                ("jobs/one/memory.current", "5000\n"),
            ],
        );
        let got = cgroup_headroom("0::/jobs/one\n", &root);
        assert_eq!(got, Some((1_000_000_000, "/jobs".to_string())));
        // A lower limit further down is tighter.
        std::fs::write(root.join("jobs/one/memory.max"), "15000\n").expect("write");
        assert_eq!(cgroup_headroom("0::/jobs/one\n", &root), Some((10_000, "/jobs/one".to_string())));
        // Over its limit (usage can pass it briefly): no room, not an underflow.
        std::fs::write(root.join("jobs/one/memory.current"), "20000\n").expect("write");
        assert_eq!(cgroup_headroom("0::/jobs/one\n", &root), Some((0, "/jobs/one".to_string())));
        // Page cache it could drop is room: 20000 used, 8000 of it inactive file pages.
        std::fs::write(root.join("jobs/one/memory.stat"), "anon 12000\nfile 8000\ninactive_file 8000\n")
            .expect("write");
        assert_eq!(cgroup_headroom("0::/jobs/one\n", &root), Some((3_000, "/jobs/one".to_string())));
        std::fs::remove_dir_all(root).expect("clean up");
    }

    #[test]
    fn v1s_memory_hierarchy_is_used_where_the_process_has_one() {
        let root = tree(
            "v1",
            &[
                ("memory/box/memory.limit_in_bytes", "2147483648\n"),
                ("memory/box/memory.usage_in_bytes", "247483648\n"),
                (
                    "memory/box/memory.stat",
                    "cache 100000000\ninactive_file 1\ntotal_inactive_file 100000000\n",
                ),
                ("memory/memory.limit_in_bytes", "9223372036854771712\n"),
                ("memory/memory.usage_in_bytes", "960503808\n"),
                // The unified hierarchy says otherwise, but does not hold the controller.
                ("memory.max", "1\n"),
                ("memory.current", "0\n"),
            ],
        );
        let proc_cgroup = "5:devices:/\n4:memory:/box\n1:cpu,cpuacct:/\n0::/\n";
        assert_eq!(cgroup_headroom(proc_cgroup, &root), Some((2_000_000_000, "/box".to_string())));
        std::fs::remove_dir_all(root).expect("clean up");
    }

    #[test]
    fn no_limit_or_nothing_to_read_limits_nothing() {
        let root = tree(
            "none",
            &[
                ("memory/memory.limit_in_bytes", "9223372036854771712\n"),
                ("memory/memory.usage_in_bytes", "1\n"),
                ("a/memory.max", "max\n"),
                ("a/memory.current", "1\n"),
            ],
        );
        assert_eq!(cgroup_headroom("4:memory:/\n0::/\n", &root), None, "v1's no-limit value");
        assert_eq!(cgroup_headroom("0::/a\n", &root), None, "v2's max");
        assert_eq!(cgroup_headroom("0::/gone\n", &root), None, "no files");
        assert_eq!(cgroup_headroom("", &root), None, "no /proc/self/cgroup");
        std::fs::remove_dir_all(root).expect("clean up");
    }
}
