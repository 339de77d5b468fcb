//! An executor group on a local 3-member etcd cluster, with a leader killed mid-run.
//!
//! ```sh
//! cargo run --example cluster --features etcd
//! ```
//!
//! (Without `--features etcd` it runs itself again with it: the feature is off by default
//! because etcd-client's build needs `protoc`, Debian `protobuf-compiler`.)
//!
//! Starts etcd three times on 127.0.0.1 (`sudo apt-get install -y etcd-server` if it is
//! missing), then three worker processes (this program again, running
//! `src/bin/group_worker.rs`) that elect a leader. The leader runs 30 procedures of 10
//! steps; the example kills it with SIGKILL, prints who took over and how long that took,
//! and checks that every procedure finished with every step's effect exactly once.

#[cfg(feature = "etcd")]
#[path = "../src/bin/group_worker.rs"]
mod group_worker;
#[cfg(not(feature = "etcd"))]
#[path = "../tests/support/with_etcd.rs"]
mod with_etcd;

#[cfg(feature = "etcd")]
fn main() {
    demo::main();
}

#[cfg(not(feature = "etcd"))]
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    with_etcd::rerun("run", &["--example", "cluster"], &args);
}

/// The example itself.
#[cfg(feature = "etcd")]
mod demo {
    use std::io::{BufRead, BufReader};
    use std::process::{Child, Command, Stdio};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use procflow_store::etcd::{ClusterError, LocalCluster};

    use super::group_worker;

    const WORKER: &str = "PROCFLOW_CLUSTER_WORKER";
    const PROCEDURES: u32 = 30;
    const STEPS: u32 = 10;

    pub fn main() {
        if std::env::var_os(WORKER).is_some() {
            return group_worker::main();
        }
        if let Err(error) = run() {
            eprintln!("cluster: {error}");
            std::process::exit(1);
        }
    }

    fn run() -> Result<(), Box<dyn std::error::Error>> {
        let cluster = match LocalCluster::start(3) {
            Ok(cluster) => cluster,
            Err(error @ ClusterError::EtcdMissing(_)) => return Err(error.into()),
            Err(error) => return Err(format!("etcd did not start: {error}").into()),
        };
        println!("etcd: 3 members at {}", cluster.endpoints().join(", "));
        let ledger = tempfile::tempdir()?;
        let (lines, received) = mpsc::channel();
        let mut workers: Vec<Child> = Vec::new();
        for i in 0..3 {
            let mut child = Command::new(std::env::current_exe()?)
                .env(WORKER, "1")
                .args([
                    "--endpoints",
                    &cluster.endpoints().join(","),
                    "--prefix",
                    "/example",
                ])
                .args(["--name", &format!("w{i}"), "--ttl", "2", "--step-ms", "100"])
                .args([
                    "--procedures",
                    &PROCEDURES.to_string(),
                    "--steps",
                    &STEPS.to_string(),
                ])
                .arg("--ledger")
                .arg(ledger.path())
                .stdout(Stdio::piped())
                .spawn()?;
            let stdout = BufReader::new(child.stdout.take().expect("piped"));
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in stdout.lines().map_while(Result::ok) {
                    let _ = lines.send((i, line));
                }
            });
            workers.push(child);
        }
        let next = |want: &dyn Fn(&str) -> bool| -> Result<(usize, String), String> {
            loop {
                match received.recv_timeout(Duration::from_secs(60)) {
                    Ok((i, line)) if want(&line) => return Ok((i, line)),
                    Ok(_) => {}
                    Err(_) => return Err("no answer from the workers within 60 s".into()),
                }
            }
        };
        let result = (|| -> Result<(), Box<dyn std::error::Error>> {
            let (leader, line) = next(&|l| l.starts_with("leading "))?;
            println!("w{leader} leads ({line}); letting it work for a second");
            std::thread::sleep(Duration::from_secs(1));
            workers[leader].kill()?;
            workers[leader].wait()?;
            let killed = Instant::now();
            println!("killed the leader w{leader} with SIGKILL");
            let (new, line) = next(&|l| l.starts_with("leading "))?;
            println!(
                "w{new} took over {:.2} s later ({line}; lease TTL 2 s)",
                killed.elapsed().as_secs_f64()
            );
            next(&|l| l.starts_with("all done"))?;
            let text = std::fs::read_to_string(ledger.path().join("ledger"))?;
            let mut seen = std::collections::BTreeSet::new();
            for line in text.lines() {
                let fields: Vec<&str> = line.split(' ').collect();
                if !seen.insert((fields[0].to_owned(), fields[1].to_owned())) {
                    return Err(format!("ledger entry written twice: {line}").into());
                }
            }
            if seen.len() != (PROCEDURES * STEPS) as usize {
                return Err(format!(
                    "{} ledger entries, expected {}",
                    seen.len(),
                    PROCEDURES * STEPS
                )
                .into());
            }
            println!(
                "every procedure finished: {PROCEDURES} × {STEPS} steps, each step's effect exactly once"
            );
            Ok(())
        })();
        for worker in &mut workers {
            let _ = worker.kill();
            let _ = worker.wait();
        }
        result
    }
}
