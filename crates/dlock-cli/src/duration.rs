//! Durations as people write them: `500ms`, `10s`, `2m`, `1h`.

use std::time::Duration;

/// A century: longer than any wait, and as far as the clock's instants are
/// sure to reach.
pub const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Parses `<number><unit>` with unit `ms`, `s`, `m` or `h` (a bare number is
/// seconds).
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 500ms, 10s or 2m"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?} (use ms, s, m or h)"
            ))
        }
    };
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(format!("{text:?} is not a valid duration"));
    }
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("{text:?} is too long a duration"))
}

/// [`parse`], refusing zero: for a limit that zero would make end before
/// it began (`--max-hold 0` would stop CMD as it starts).
pub fn parse_positive(text: &str) -> Result<Duration, String> {
    let duration = parse(text)?;
    match duration.is_zero() {
        true => Err(format!("{text:?}: must be more than zero")),
        false => Ok(duration),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("3"), Ok(Duration::from_secs(3)));
        assert!(parse("10x").unwrap_err().contains("unknown unit"));
        assert!(parse("").is_err());
        assert!(parse("ms").is_err());
        // Longer than a Duration holds: refused, not a panic.
        assert!(parse("1e30s").is_err() && parse(&"9".repeat(30)).is_err());
        assert!(parse(&"9".repeat(30)).unwrap_err().contains("too long"));
        // Longer than any wait, yet countable: for ever, as Duration::MAX.
        assert!(parse("100000000000h").is_ok());
        assert!(parse_positive("0s").unwrap_err().contains("more than zero"));
        assert_eq!(parse_positive("1ms"), Ok(Duration::from_millis(1)));
    }
}
