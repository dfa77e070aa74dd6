//! What every result row records about where and when it was taken: machine, date, commit, load.

use std::process::Command;

use serde_json::{Value, json};

use crate::cmd;

/// The CPU model (`/proc/cpuinfo` on Linux, `sysctl` on macOS), or `unknown CPU`.
pub(crate) fn cpu_model() -> String {
    if let Ok(info) = std::fs::read_to_string("/proc/cpuinfo")
        && let Some(line) = info.lines().find(|l| l.starts_with("model name"))
        && let Some((_, name)) = line.split_once(':')
    {
        return name.trim().to_owned();
    }
    quiet_output(Command::new("sysctl").args(["-n", "machdep.cpu.brand_string"]))
        .unwrap_or_else(|| "unknown CPU".to_owned())
}

/// `name, memory, driver` of each NVIDIA GPU from `nvidia-smi`, when there is one.
pub(crate) fn nvidia_gpus() -> Option<String> {
    quiet_output(Command::new("nvidia-smi").args([
        "--query-gpu=name,memory.total,driver_version",
        "--format=csv,noheader",
    ]))
    .map(|s| s.lines().collect::<Vec<_>>().join("; "))
}

/// The 1-minute load average (Linux), to judge how quiet the machine was.
pub(crate) fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The commit: `$MTP_GIT_COMMIT` (set by `gpu.sh`, whose copy has no `.git`),
/// else `git rev-parse --short HEAD` with `-dirty` when tracked files differ.
pub(crate) fn commit() -> String {
    if let Ok(c) = std::env::var("MTP_GIT_COMMIT") {
        return c;
    }
    let git = |args: &[&str]| {
        let mut c = Command::new("git");
        c.current_dir(cmd::root()).args(args);
        quiet_output(&mut c)
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(head) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty { format!("{head}-dirty") } else { head }
        }
        None => "unknown".to_owned(),
    }
}

/// Now in UTC, `YYYY-MM-DDTHH:MM:SSZ`.
pub(crate) fn now_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc_from_unix(secs)
}

/// `secs` since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (proleptic Gregorian).
pub(crate) fn utc_from_unix(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// One line naming the machine: the GPU(s) when `nvidia-smi` finds any, then the CPU.
pub(crate) fn describe() -> String {
    match nvidia_gpus() {
        Some(g) => format!("{g} / {}", cpu_model()),
        None => cpu_model(),
    }
}

/// The fields every row gets: machine, date, commit, load average.
pub(crate) fn stamp() -> Value {
    json!({
        "machine": describe(),
        "date": now_utc(),
        "commit": commit(),
        "load_avg_1m": load_average(),
        "os": std::env::consts::OS,
    })
}

fn quiet_output(c: &mut Command) -> Option<String> {
    let out = c.stderr(std::process::Stdio::null()).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::utc_from_unix;

    #[test]
    fn unix_seconds_format_as_utc_dates() {
        let check = |secs: u64, want: &str| assert_eq!(utc_from_unix(secs), want, "{secs}");
        check(0, "1970-01-01T00:00:00Z");
        check(951_782_400, "2000-02-29T00:00:00Z");
        check(1_764_460_800, "2025-11-30T00:00:00Z");
        check(1_764_460_800 + 3661, "2025-11-30T01:01:01Z");
    }
}
