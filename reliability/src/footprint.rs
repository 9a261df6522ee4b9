//! What a deployment started by this process costs the machine: the memory and CPU time of
//! every process descended from this one (the databases, brokers, proxies, checkouts and
//! consumers the test kit started), read from `/proc`. Memory is the proportional set size, so
//! that PostgreSQL's shared buffers, mapped by each of its processes, count once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One look at the descendants.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    pub processes: usize,
    pub pss_bytes: u64,
}

/// What a stretch of time cost: the largest memory seen, and the CPU the processes used, in
/// cores on average (2.0: both of this machine's cores all the time).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cost {
    pub peak: Sample,
    pub cores: f64,
    /// How long the stretch was.
    pub seconds: f64,
}

/// The processes under this one now, and each one's CPU time so far (user + system, seconds).
fn descendants() -> HashMap<u32, f64> {
    let root = std::process::id();
    let mut parents: HashMap<u32, (u32, f64)> = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return HashMap::new();
    };
    // Linux's USER_HZ, which `/proc/*/stat` counts in, is 100 on every architecture it runs on.
    const TICKS: f64 = 100.0;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The command name, in parentheses, may hold spaces: fields count from after it.
        let Some(after) = stat.rfind(')').map(|at| &stat[at + 2..]) else {
            continue;
        };
        let fields: Vec<&str> = after.split(' ').collect();
        let field = |n: usize| fields.get(n).and_then(|f| f.parse::<f64>().ok());
        if let (Some(ppid), Some(utime), Some(stime)) = (field(1), field(11), field(12)) {
            parents.insert(pid, (ppid as u32, (utime + stime) / TICKS));
        }
    }
    let mut found = HashMap::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for (pid, (ppid, cpu)) in &parents {
            if *ppid == parent && found.insert(*pid, *cpu).is_none() {
                frontier.push(*pid);
            }
        }
    }
    found
}

fn pss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|line| line.starts_with("Pss:"))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// The descendants' memory now.
pub fn sample() -> Sample {
    look().1
}

/// The descendants with their CPU time so far, and their memory now.
fn look() -> (HashMap<u32, f64>, Sample) {
    let pids = descendants();
    let now = Sample {
        processes: pids.len(),
        pss_bytes: pids.keys().map(|pid| pss_bytes(*pid)).sum(),
    };
    (pids, now)
}

/// Samples the descendants every `every` until [`Sampler::stop`].
pub struct Sampler {
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
    started: Instant,
}

#[derive(Default)]
struct State {
    peak: Sample,
    /// Each process's CPU time when first and last seen: one killed meanwhile keeps what it
    /// used until its last sample.
    cpu: HashMap<u32, (f64, f64)>,
}

impl Sampler {
    pub fn start(every: Duration) -> Sampler {
        let state = Arc::new(Mutex::new(State::default()));
        let task = {
            let state = state.clone();
            tokio::spawn(async move {
                loop {
                    let (pids, now) = tokio::task::spawn_blocking(look).await.unwrap_or_default();
                    {
                        let mut state = state.lock().unwrap();
                        if now.pss_bytes > state.peak.pss_bytes {
                            state.peak = now;
                        }
                        for (pid, cpu) in pids {
                            state.cpu.entry(pid).or_insert((cpu, cpu)).1 = cpu;
                        }
                    }
                    tokio::time::sleep(every).await;
                }
            })
        };
        Sampler {
            state,
            task,
            started: Instant::now(),
        }
    }

    pub fn stop(self) -> Cost {
        self.task.abort();
        let state = self.state.lock().unwrap();
        let used: f64 = state.cpu.values().map(|(first, last)| last - first).sum();
        let seconds = self.started.elapsed().as_secs_f64().max(0.001);
        Cost {
            peak: state.peak,
            cores: used / seconds,
            seconds,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_started_process_is_counted_with_its_memory() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let seen = descendants();
        let pss = pss_bytes(child.id());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(seen.contains_key(&child.id()), "{seen:?}");
        assert!(pss > 0);
    }
}
