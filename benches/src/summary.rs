//! Mean and median of a set of timings.

use std::time::Duration;

/// Mean and median of `n` samples, in microseconds. `p50_us` is NaN when only a mean is known.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub mean_us: f64,
    pub p50_us: f64,
}

impl Summary {
    /// From individual samples. An empty set gives NaNs.
    pub fn of(samples: &[Duration]) -> Summary {
        let n = samples.len();
        if n == 0 {
            return Summary { n, mean_us: f64::NAN, p50_us: f64::NAN };
        }
        let mut us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
        let mean_us = us.iter().sum::<f64>() / n as f64;
        us.sort_by(f64::total_cmp);
        let p50_us = if n % 2 == 1 { us[n / 2] } else { (us[n / 2 - 1] + us[n / 2]) / 2.0 };
        Summary { n, mean_us, p50_us }
    }

    /// A mean over `n` operations without individual samples.
    pub fn mean_only(n: usize, mean_us: f64) -> Summary {
        Summary { n, mean_us, p50_us: f64::NAN }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_median() {
        let s = Summary::of(&[1, 2, 3, 10].map(Duration::from_micros));
        assert_eq!(s.n, 4);
        assert!((s.mean_us - 4.0).abs() < 1e-9);
        assert!((s.p50_us - 2.5).abs() < 1e-9);
        let odd = Summary::of(&[5, 1, 3].map(Duration::from_micros));
        assert!((odd.p50_us - 3.0).abs() < 1e-9);
        assert!(Summary::of(&[]).mean_us.is_nan());
    }
}
