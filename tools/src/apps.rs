//! The applications the runner knows, with their small sizes (for quick runs), their iteration
//! counts (for per-iteration message counts) and the target for each at 2 nodes.

/// One application.
#[derive(Debug)]
pub struct AppSpec {
    pub name: &'static str,
    /// Arguments for `--small` runs (the default size otherwise).
    pub small: &'static [&'static str],
    /// Iterations at the default size, and at the small size, for iterative apps.
    pub iterations: Option<(u64, u64)>,
    /// Most DSM time over threads time at 2 nodes (at the default size, on a 2-core machine).
    pub target: f64,
    /// The app also has a hand-written message-passing version (`--mode mp`), run beside the
    /// DSM for comparison.
    pub message_passing: bool,
}

/// Every app of the suite.
pub const ALL: &[AppSpec] = &[
    AppSpec {
        name: "sor",
        small: &["--rows", "500", "--cols", "500", "--iterations", "20"],
        iterations: Some((1000, 20)),
        target: 1.3,
        message_passing: false,
    },
    AppSpec {
        name: "jacobi3d",
        small: &["--nx", "64", "--ny", "64", "--nz", "32", "--iterations", "5"],
        iterations: Some((1000, 5)),
        target: 1.3,
        message_passing: false,
    },
    AppSpec {
        name: "water",
        small: &["--molecules", "64", "--steps", "2"],
        iterations: Some((20, 2)),
        target: 1.3,
        message_passing: false,
    },
    AppSpec {
        name: "barnes",
        small: &["--bodies", "1024", "--steps", "1"],
        iterations: Some((4, 1)),
        target: 2.0,
        message_passing: false,
    },
    AppSpec {
        name: "tsp",
        small: &["--cities", "10"],
        iterations: None,
        target: 2.0,
        message_passing: false,
    },
    AppSpec {
        name: "qsort",
        small: &["--keys", "100000"],
        iterations: None,
        target: 2.0,
        message_passing: false,
    },
    AppSpec {
        name: "is",
        small: &["--log2keys", "16", "--log2max", "12", "--iterations", "2"],
        iterations: Some((10, 2)),
        target: 2.0,
        message_passing: false,
    },
    AppSpec { name: "fft", small: &["--log2n", "12"], iterations: None, target: 2.0, message_passing: false },
    AppSpec {
        name: "lu",
        small: &["--size", "128", "--block", "16"],
        iterations: None,
        target: 1.3,
        message_passing: false,
    },
    AppSpec {
        name: "radix",
        small: &["--keys", "100000"],
        iterations: None,
        target: 2.0,
        message_passing: true,
    },
    AppSpec {
        name: "matmul",
        small: &["--size", "128"],
        iterations: None,
        target: 1.3,
        message_passing: false,
    },
];

/// The app called `name`.
pub fn find(name: &str) -> Option<&'static AppSpec> {
    ALL.iter().find(|a| a.name == name)
}
