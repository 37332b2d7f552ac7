//! The launcher's log output: one line per event on stderr, in the same
//! shape as the full tool's `tracing_subscriber::fmt` lines
//! (`2026-01-02T03:04:05.678901Z  WARN message key=value`).
//!
//! The launcher emits a handful of events and no spans, and every sandbox
//! start pays for its set-up; `tracing_subscriber`'s registry allocates and
//! zeroes a 32 KiB table for span storage before the first event. This
//! subscriber keeps nothing.

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Installs the logger as the global default; `ansi` colours the level.
pub fn init(max: LevelFilter, ansi: bool) {
    let _ = tracing::subscriber::set_global_default(StderrLog { max, ansi });
}

struct StderrLog {
    max: LevelFilter,
    ansi: bool,
}

impl Subscriber for StderrLog {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= self.max
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(self.max)
    }

    // No span is ever recorded: they all share one id.
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut line = String::with_capacity(128);
        timestamp(&mut line, SystemTime::now());
        let level = *event.metadata().level();
        let (name, colour) = match level {
            Level::ERROR => ("ERROR", "31"),
            Level::WARN => (" WARN", "33"),
            Level::INFO => (" INFO", "32"),
            Level::DEBUG => ("DEBUG", "34"),
            Level::TRACE => ("TRACE", "35"),
        };
        if self.ansi {
            let _ = write!(line, " \x1b[{colour}m{name}\x1b[0m ");
        } else {
            let _ = write!(line, " {name} ");
        }
        event.record(&mut Fields { line: &mut line, first: true });
        line.push('\n');
        let _ = std::io::stderr().write_all(line.as_bytes());
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// The message first, then `key=value` for the other fields.
struct Fields<'a> {
    line: &'a mut String,
    first: bool,
}

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if !self.first {
            self.line.push(' ');
        }
        self.first = false;
        if field.name() == "message" {
            let _ = write!(self.line, "{value:?}");
        } else {
            let _ = write!(self.line, "{}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }
}

/// RFC 3339 in UTC with microseconds, as `tracing_subscriber` prints it.
fn timestamp(out: &mut String, now: SystemTime) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    let _ = write!(
        out,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        since.subsec_micros()
    );
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian
/// calendar (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc_with_microseconds() {
        let at = |secs: u64, micros: u32| {
            let mut s = String::new();
            timestamp(&mut s, UNIX_EPOCH + Duration::new(secs, micros * 1000));
            s
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.000005Z");
        assert_eq!(at(1_795_503_045, 678_901), "2026-11-24T06:50:45.678901Z");
        assert_eq!(at(4_102_444_799, 999_999), "2099-12-31T23:59:59.999999Z");
    }
}
