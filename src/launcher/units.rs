//! Parsing the human-friendly quantities of the command line: sizes
//! (`512M`), durations (`30s`) and CPU counts (`1.5`).

use std::time::Duration;

/// A quantity of the command line that does not parse; `text` is what was
/// given. Clap prints these after the option's name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error("{0:?} is not a size like 512M or 2G")]
    NotSize(String),
    #[error("{0:?} is too large")]
    SizeTooLarge(String),
    #[error("{0:?} must be more than 0")]
    SizeZero(String),
    #[error("{0:?} is not a duration like 30s or 10m")]
    NotDuration(String),
    #[error("{text:?}: unknown unit {unit:?} (use ms, s, m or h)")]
    UnknownUnit { text: String, unit: String },
    #[error("{0:?} is out of range")]
    DurationRange(String),
    #[error("{0:?} is not a number of CPUs like 1 or 0.5")]
    NotCpus(String),
    #[error("{0:?} must be between 0.01 and 4096")]
    CpusRange(String),
    #[error("{0:?} is not a number of seconds")]
    NotSeconds(String),
    #[error("{0:?} must be a positive number of seconds")]
    SecondsNotPositive(String),
}

/// `1234`, `64K`, `512M`, `2G`, `1T` (binary multiples, any case; an
/// optional `B`/`iB`).
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
    let lower = text.trim().to_ascii_lowercase();
    let t = lower.strip_suffix("ib").or_else(|| lower.strip_suffix('b')).unwrap_or(&lower);
    let (digits, shift) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 10),
        Some('m') => (&t[..t.len() - 1], 20),
        Some('g') => (&t[..t.len() - 1], 30),
        Some('t') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = digits.parse().map_err(|_| UnitError::NotSize(text.into()))?;
    let bytes = n.checked_mul(1u64 << shift).ok_or_else(|| UnitError::SizeTooLarge(text.into()))?;
    if bytes == 0 {
        return Err(UnitError::SizeZero(text.into()));
    }
    Ok(bytes)
}

/// As [`parse_size`], where `0` is allowed and means "no cap".
pub fn parse_size_or_unlimited(text: &str) -> Result<u64, UnitError> {
    match parse_size(text) {
        Err(UnitError::SizeZero(_)) => Ok(0),
        other => other,
    }
}

/// `500ms`, `30s`, `10m`, `1h`, or plain seconds (`30`, `2.5`).
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    let t = text.trim();
    let (number, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&t[..i], &t[i..]),
        None => (t, "s"),
    };
    let n: f64 = number.parse().map_err(|_| UnitError::NotDuration(text.into()))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(UnitError::UnknownUnit { text: text.into(), unit: unit.into() }),
    };
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(UnitError::DurationRange(text.into()));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// CPUs as thousandths: `1.5` → 1500.
pub fn parse_cpus(text: &str) -> Result<u64, UnitError> {
    let n: f64 = text.trim().parse().map_err(|_| UnitError::NotCpus(text.into()))?;
    if !n.is_finite() || !(0.01..=4096.0).contains(&n) {
        return Err(UnitError::CpusRange(text.into()));
    }
    Ok((n * 1000.0).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_means_unlimited_only_where_asked() {
        assert_eq!(parse_size_or_unlimited("0").unwrap(), 0);
        assert_eq!(parse_size_or_unlimited("0MiB").unwrap(), 0);
        assert_eq!(parse_size_or_unlimited("2K").unwrap(), 2048);
        assert!(parse_size_or_unlimited("x").is_err());
        assert!(parse_size("0").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("512k").unwrap(), 512 << 10);
        assert_eq!(parse_size("2gb").unwrap(), 2 << 30);
        assert_eq!(parse_size("512KiB").unwrap(), 512 << 10);
        for bad in ["", "m", "-1m", "1.5g", "0", "lots", "99999999999g"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("3 days").is_err());
    }

    /// The texts clap prints after the option, as before they were typed.
    #[test]
    fn error_texts() {
        let text = "x";
        let cases = [
            (parse_size(text).unwrap_err(), format!("{text:?} is not a size like 512M or 2G")),
            (parse_size("99999999999g").unwrap_err(), format!("{:?} is too large", "99999999999g")),
            (parse_size("0").unwrap_err(), format!("{:?} must be more than 0", "0")),
            (parse_duration(text).unwrap_err(), format!("{text:?} is not a duration like 30s or 10m")),
            (
                parse_duration("3d").unwrap_err(),
                format!("{:?}: unknown unit {:?} (use ms, s, m or h)", "3d", "d"),
            ),
            (parse_duration("-1").unwrap_err(), format!("{:?} is out of range", "-1")),
            (parse_cpus(text).unwrap_err(), format!("{text:?} is not a number of CPUs like 1 or 0.5")),
            (parse_cpus("0").unwrap_err(), format!("{:?} must be between 0.01 and 4096", "0")),
        ];
        for (error, old) in cases {
            assert_eq!(error.to_string(), old);
        }
    }

    #[test]
    fn cpus() {
        assert_eq!(parse_cpus("1.5").unwrap(), 1500);
        assert!(parse_cpus("0").is_err());
    }
}
