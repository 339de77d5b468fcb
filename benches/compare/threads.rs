//! `--threads` (with `--cell KIND:N`): where the cell's CPU goes, by thread.
//!
//! The ratios say how fast a cell runs, not what it spends. A durable step at 1,024
//! procedures shares two cores between Tokio's workers and the WAL's committer thread,
//! and whether it is bound by their CPU or by waiting on each other decides what a
//! redesign must change (docs/BENCHMARKS.md, "Issue 33 in stop 60"). This samples every
//! thread's `/proc/self/task/*/schedstat` over the middle half of the cell and prints, per
//! thread name: the CPUs it kept busy, its CPU time per step, and how long it sat
//! runnable without a CPU (the scheduler's delay) per step.
//!
//! Linux only: elsewhere nothing is counted. A thread that ends inside the window is not
//! counted; one that starts inside it is, from its start.

use std::collections::BTreeMap;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Each thread's name, nanoseconds on a CPU and nanoseconds waiting for one, by thread
/// id.
#[derive(Default)]
struct Sample(BTreeMap<u64, (String, u64, u64)>);

impl Sample {
    /// Every thread of this process, now.
    fn now() -> Self {
        let mut sample = Sample::default();
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return sample;
        };
        for task in tasks.flatten() {
            let path = task.path();
            let id = task.file_name().to_string_lossy().parse().unwrap_or(0);
            let (Ok(comm), Ok(stat)) = (
                std::fs::read_to_string(path.join("comm")),
                std::fs::read_to_string(path.join("schedstat")),
            ) else {
                continue; // The thread ended meanwhile.
            };
            let mut fields = stat
                .split_whitespace()
                .map(|f| f.parse::<u64>().unwrap_or(0));
            let (on_cpu, waiting) = (fields.next().unwrap_or(0), fields.next().unwrap_or(0));
            sample
                .0
                .insert(id, (comm.trim().to_owned(), on_cpu, waiting));
        }
        sample
    }
}

/// Two samples, a quarter and three quarters into a cell of `cell`.
pub struct Window(JoinHandle<(Sample, Sample, Duration)>);

impl Window {
    /// Starts sampling a cell that begins now and runs for `cell`.
    pub fn start(cell: Duration) -> Self {
        Window(std::thread::spawn(move || {
            std::thread::sleep(cell / 4);
            let (first, began) = (Sample::now(), Instant::now());
            std::thread::sleep(cell / 2);
            (first, Sample::now(), began.elapsed())
        }))
    }

    /// Prints the window's figures for `cell`, which ran at `rate` steps (or commits) a
    /// second on average.
    pub fn print(self, cell: &str, rate: f64) {
        let Ok((first, last, window)) = self.0.join() else {
            return;
        };
        let steps = rate * window.as_secs_f64();
        let seconds = window.as_nanos() as f64;
        // Each thread's own difference first (one that started inside the window counts
        // from its start), then summed by name.
        let mut by_name: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for (id, (name, on_cpu, waiting)) in &last.0 {
            let (was_on, was_waiting) = first.0.get(id).map_or((0, 0), |t| (t.1, t.2));
            let sum = by_name.entry(name).or_default();
            sum.0 += on_cpu.saturating_sub(was_on);
            sum.1 += waiting.saturating_sub(was_waiting);
        }
        let mut total = (0.0, 0.0);
        for (name, (busy, delayed)) in by_name {
            let (busy, delayed) = (busy as f64, delayed as f64);
            if busy == 0.0 {
                continue;
            }
            total.0 += busy;
            total.1 += delayed;
            println!(
                "{cell}: thread {name}: {:.2} CPUs, {:.2} us of CPU and {:.2} us runnable without one per step",
                busy / seconds,
                busy / steps / 1e3,
                delayed / steps / 1e3
            );
        }
        println!(
            "{cell}: all threads: {:.2} CPUs, {:.2} us of CPU and {:.2} us runnable without one per step",
            total.0 / seconds,
            total.0 / steps / 1e3,
            total.1 / steps / 1e3
        );
    }
}
