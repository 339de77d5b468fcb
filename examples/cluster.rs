//! An executor group on a local 3-member etcd cluster, or on a local PostgreSQL server,
//! with a leader killed mid-run.
//!
//! ```sh
//! cargo run --example cluster --features etcd
//! cargo run --example cluster --features postgres -- --postgres
//! ```
//!
//! (Without the feature it runs itself again with it: both are off by default, and
//! etcd-client's build needs `protoc`, Debian `protobuf-compiler`.)
//!
//! Starts etcd three times on 127.0.0.1 (`sudo apt-get install -y etcd-server` if it is
//! missing), or with `--postgres` one PostgreSQL server in a temporary directory (`sudo
//! apt-get install -y postgresql`), then three worker processes (this program again,
//! running `src/bin/group_worker.rs`) that elect a leader. The leader runs 30 procedures
//! of 10 steps; the example kills it with SIGKILL, prints who took over and how long that
//! took, and checks that every procedure finished with every step's effect exactly once.

#[path = "../src/bin/group_worker.rs"]
mod group_worker;
#[path = "../tests/support/with_feature.rs"]
mod with_feature;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if std::env::var_os(demo::WORKER).is_some() {
        return group_worker::main();
    }
    let postgres = args.iter().any(|arg| arg == "--postgres");
    let (feature, built_with) = [
        ("etcd", cfg!(feature = "etcd")),
        ("postgres", cfg!(feature = "postgres")),
    ][usize::from(postgres)];
    if !built_with {
        with_feature::rerun(feature, "run", &["--example", "cluster"], &args);
    }
    if let Err(error) = demo::run(postgres) {
        eprintln!("cluster: {error}");
        std::process::exit(1);
    }
}

/// The servers the workers use, kept running until the example ends.
mod servers {
    /// The running servers, and the worker arguments that name the store on them.
    pub type Started = (Box<dyn std::any::Any>, Vec<String>);

    /// A local 3-member etcd cluster.
    #[cfg(feature = "etcd")]
    pub fn etcd() -> Result<Started, Box<dyn std::error::Error>> {
        use procflow_store::etcd::{ClusterError, LocalCluster};
        let cluster = match LocalCluster::start(3) {
            Ok(cluster) => cluster,
            Err(error @ ClusterError::EtcdMissing(_)) => return Err(error.into()),
            Err(error) => return Err(format!("etcd did not start: {error}").into()),
        };
        let endpoints = cluster.endpoints().join(",");
        println!("etcd: 3 members at {endpoints}");
        let args = ["--endpoints", &endpoints, "--prefix", "/example"];
        Ok((Box::new(cluster), args.map(str::to_owned).to_vec()))
    }

    /// A local PostgreSQL server.
    #[cfg(feature = "postgres")]
    pub fn postgres() -> Result<Started, Box<dyn std::error::Error>> {
        use procflow_store::postgres::LocalPostgres;
        let server = LocalPostgres::start()?;
        let connection = server.connection_string();
        println!(
            "PostgreSQL at 127.0.0.1:{} (data in {})",
            server.port(),
            server.dir().display()
        );
        let args = ["--postgres", &connection, "--schema", "example"];
        Ok((Box::new(server), args.map(str::to_owned).to_vec()))
    }

    // Not reached: `main` runs the example again with the feature first.
    #[cfg(not(feature = "etcd"))]
    pub fn etcd() -> Result<Started, Box<dyn std::error::Error>> {
        Err("built without the feature `etcd`".into())
    }

    #[cfg(not(feature = "postgres"))]
    pub fn postgres() -> Result<Started, Box<dyn std::error::Error>> {
        Err("built without the feature `postgres`".into())
    }
}

/// The example itself.
mod demo {
    use std::io::{BufRead, BufReader};
    use std::process::{Child, Command, Stdio};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    pub const WORKER: &str = "PROCFLOW_CLUSTER_WORKER";
    const PROCEDURES: u32 = 30;
    const STEPS: u32 = 10;

    pub fn run(postgres: bool) -> Result<(), Box<dyn std::error::Error>> {
        let (_servers, store) = if postgres {
            super::servers::postgres()?
        } else {
            super::servers::etcd()?
        };
        let ledger = tempfile::tempdir()?;
        let (lines, received) = mpsc::channel();
        let mut workers: Vec<Child> = Vec::new();
        for i in 0..3 {
            let mut child = Command::new(std::env::current_exe()?)
                .env(WORKER, "1")
                .args(&store)
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
