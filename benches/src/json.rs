//! The one-line JSON object of figures (`{"ping_us":41.2,...}`): writing it, and reading back
//! the one a re-executed launcher prints. Flat objects of numbers only; NaN is `null`.

/// Formats `fields` as one flat JSON object.
pub fn object(fields: &[(String, f64)]) -> String {
    let body: Vec<String> = fields
        .iter()
        .map(|(k, v)| if v.is_finite() { format!("\"{k}\":{v:.3}") } else { format!("\"{k}\":null") })
        .collect();
    format!("{{{}}}", body.join(","))
}

/// Parses a flat JSON object of numbers (or `null`, read as NaN), as [`object`] writes it.
pub fn parse(line: &str) -> Option<Vec<(String, f64)>> {
    let inner = line.trim().strip_prefix('{')?.strip_suffix('}')?.trim();
    if inner.is_empty() {
        return Some(Vec::new());
    }
    inner
        .split(',')
        .map(|pair| {
            let (k, v) = pair.split_once(':')?;
            let k = k.trim().strip_prefix('"')?.strip_suffix('"')?;
            let v = v.trim();
            let v = if v == "null" { f64::NAN } else { v.parse().ok()? };
            Some((k.to_string(), v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let fields = vec![("ping_us".to_string(), 41.25), ("p50".to_string(), f64::NAN)];
        let line = object(&fields);
        assert_eq!(line, r#"{"ping_us":41.250,"p50":null}"#);
        let back = parse(&line).unwrap();
        assert_eq!(back[0], ("ping_us".to_string(), 41.25));
        assert!(back[1].1.is_nan());
        assert_eq!(parse("{}").unwrap(), vec![]);
        assert!(parse("not json").is_none());
    }
}
