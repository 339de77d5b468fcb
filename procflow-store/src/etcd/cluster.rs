//! [`LocalCluster`]: real etcd processes on 127.0.0.1, for tests and examples.

use std::io::{Read, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How often [`LocalCluster::start_with`] picks new ports after one was taken under it.
const START_ATTEMPTS: usize = 3;

/// The command that installs etcd on the machines procflow is tested on (Debian).
pub const INSTALL_ETCD: &str = "sudo apt-get install -y etcd-server";

/// Why a [`LocalCluster`] could not start or change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The `etcd` binary is not installed (or not on `PATH`, or not at `$ETCD_BIN`).
    #[error("the `etcd` binary was not found ({0}); install it with: {INSTALL_ETCD}")]
    EtcdMissing(String),
    /// Starting, stopping or asking a member failed.
    #[error("etcd member {member}: {message}")]
    Member {
        /// The member's index.
        member: usize,
        /// What went wrong.
        message: String,
    },
}

/// One etcd process of the cluster.
#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    process: Option<Child>,
}

/// A cluster of etcd processes on 127.0.0.1, on free ports, with data in a temporary
/// directory. Dropping it kills every member (SIGKILL, by PID) and removes the data, also
/// when a test panics.
///
/// The binary is `$ETCD_BIN` if set, else `etcd` on `PATH`; if it is missing,
/// [`start`](Self::start) fails with [`ClusterError::EtcdMissing`], which names the
/// install command.
///
/// # Examples
///
/// ```no_run
/// use procflow_store::etcd::LocalCluster;
///
/// let cluster = LocalCluster::start(3)?;
/// println!("etcd at {}", cluster.endpoints().join(","));
/// # Ok::<(), procflow_store::etcd::ClusterError>(())
/// ```
#[derive(Debug)]
pub struct LocalCluster {
    binary: PathBuf,
    members: Vec<Member>,
    initial_cluster: String,
    token: String,
    dir: tempfile::TempDir,
    options: ClusterOptions,
}

/// How a [`LocalCluster`]'s members run, beyond what every one needs.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct ClusterOptions {
    /// `--quota-backend-bytes`: the database size past which etcd refuses writes
    /// (`mvcc: database space exceeded`); etcd's default (2 GiB) when `None`.
    pub quota_bytes: Option<u64>,
}

impl ClusterOptions {
    /// etcd's defaults.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`quota_bytes`](Self::quota_bytes).
    #[must_use]
    pub fn quota_bytes(mut self, bytes: u64) -> Self {
        self.quota_bytes = Some(bytes);
        self
    }
}

impl LocalCluster {
    /// Starts `size` members and waits (up to 30 s) until every one reports healthy.
    ///
    /// # Errors
    ///
    /// [`ClusterError::EtcdMissing`] without the binary; [`ClusterError::Member`] if a
    /// member does not start or become healthy.
    pub fn start(size: usize) -> Result<Self, ClusterError> {
        Self::start_with(size, ClusterOptions::default())
    }

    /// [`start`](Self::start), the members run with `options`.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_with(size: usize, options: ClusterOptions) -> Result<Self, ClusterError> {
        let binary = etcd_binary()?;
        let mut attempt = 1;
        loop {
            match Self::try_start(&binary, size, &options) {
                // A port picked free was taken before the member bound it: pick again.
                Err(ClusterError::Member { message, .. })
                    if attempt < START_ATTEMPTS && message.contains("address already in use") =>
                {
                    attempt += 1;
                }
                started => return started,
            }
        }
    }

    /// One attempt of [`start_with`](Self::start_with), on fresh ports and a fresh directory.
    fn try_start(
        binary: &Path,
        size: usize,
        options: &ClusterOptions,
    ) -> Result<Self, ClusterError> {
        let binary = binary.to_path_buf();
        let dir = tempfile::Builder::new()
            .prefix("procflow-etcd-")
            .tempdir()
            .map_err(|e| member_error(0, format!("cannot create a data directory: {e}")))?;
        let members: Vec<Member> = (0..size)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: crate::free_local_port(),
                peer_port: crate::free_local_port(),
                process: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let token = dir
            .path()
            .file_name()
            .map_or_else(|| "procflow".into(), |n| n.to_string_lossy().into_owned());
        let mut cluster = Self {
            binary,
            members,
            initial_cluster,
            token,
            dir,
            options: options.clone(),
        };
        for i in 0..size {
            cluster.spawn(i)?;
        }
        for i in 0..size {
            cluster.wait_healthy(i, Duration::from_secs(30))?;
        }
        Ok(cluster)
    }

    /// Every member's client endpoint, `127.0.0.1:port`.
    #[must_use]
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// Member `i`'s client endpoint.
    #[must_use]
    pub fn endpoint(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.members[i].client_port)
    }

    /// Member `i`'s process id, if it runs.
    #[must_use]
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].process.as_ref().map(Child::id)
    }

    /// Kills member `i` with SIGKILL and reaps it. Its data stays for [`restart`](Self::restart).
    ///
    /// # Errors
    ///
    /// [`ClusterError::Member`] if the kill fails.
    pub fn kill(&mut self, i: usize) -> Result<(), ClusterError> {
        if let Some(mut process) = self.members[i].process.take() {
            process
                .kill()
                .and_then(|()| process.wait().map(drop))
                .map_err(|e| member_error(i, format!("cannot kill: {e}")))?;
        }
        Ok(())
    }

    /// Starts member `i` again on its data and waits until it is healthy.
    ///
    /// # Errors
    ///
    /// [`ClusterError::Member`] if it does not come back within 30 s.
    pub fn restart(&mut self, i: usize) -> Result<(), ClusterError> {
        self.kill(i)?;
        self.spawn(i)?;
        self.wait_healthy(i, Duration::from_secs(30))
    }

    /// The index of the member etcd elected leader, asked of every running member's
    /// `/metrics` (`etcd_server_is_leader 1`).
    #[must_use]
    pub fn leader(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| {
            self.members[i].process.is_some()
                && http_get(self.members[i].client_port, "/metrics")
                    .is_some_and(|body| body.lines().any(|l| l == "etcd_server_is_leader 1"))
        })
    }

    fn spawn(&mut self, i: usize) -> Result<(), ClusterError> {
        let member = &self.members[i];
        let data = self.dir.path().join(&member.name);
        let log = std::fs::File::create(self.dir.path().join(format!("{}.log", member.name)))
            .map_err(|e| member_error(i, format!("cannot create its log: {e}")))?;
        let client = format!("http://127.0.0.1:{}", member.client_port);
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let process = Command::new(&self.binary)
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(&data)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", "new"])
            // Fast elections on loopback: a dead etcd leader is replaced in about a second.
            .args(["--heartbeat-interval", "100", "--election-timeout", "1000"])
            // History is compacted by its users (EtcdStore), never behind their back.
            .args(["--auto-compaction-retention", "0"])
            .args(self.extra_args())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| member_error(i, format!("cannot start {}: {e}", self.binary.display())))?;
        self.members[i].process = Some(process);
        Ok(())
    }

    /// The options' command-line arguments.
    fn extra_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(bytes) = self.options.quota_bytes {
            args.extend(["--quota-backend-bytes".to_owned(), bytes.to_string()]);
        }
        args
    }

    fn wait_healthy(&mut self, i: usize, timeout: Duration) -> Result<(), ClusterError> {
        let deadline = Instant::now() + timeout;
        let port = self.members[i].client_port;
        loop {
            if http_get(port, "/health").is_some_and(|body| body.contains("\"health\":\"true\"")) {
                return Ok(());
            }
            if let Some(process) = self.members[i].process.as_mut()
                && let Ok(Some(status)) = process.try_wait()
            {
                return Err(member_error(
                    i,
                    format!("exited with {status}; {}", self.log_tail(i)),
                ));
            }
            if Instant::now() > deadline {
                return Err(member_error(
                    i,
                    format!("not healthy after {timeout:?}; {}", self.log_tail(i)),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log_tail(&self, i: usize) -> String {
        let name = &self.members[i].name;
        crate::server_log::log_tail(&self.dir.path().join(format!("{name}.log")))
    }

    /// The directory holding the members' data and logs.
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(mut process) = member.process.take() {
                let _ = process.kill();
                let _ = process.wait();
            }
        }
    }
}

fn etcd_binary() -> Result<PathBuf, ClusterError> {
    let binary = std::env::var_os("ETCD_BIN").map_or_else(|| PathBuf::from("etcd"), PathBuf::from);
    match Command::new(&binary)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(status) if status.success() => Ok(binary),
        Ok(status) => Err(ClusterError::EtcdMissing(format!(
            "`{} --version` exited with {status}",
            binary.display()
        ))),
        Err(error) => Err(ClusterError::EtcdMissing(format!(
            "{}: {error}",
            binary.display()
        ))),
    }
}

fn member_error(member: usize, message: String) -> ClusterError {
    ClusterError::Member { member, message }
}

/// The body of `GET path` on 127.0.0.1:`port`, if it answers within a second.
fn http_get(port: u16, path: &str) -> Option<String> {
    let timeout = Duration::from_secs(1);
    let mut stream = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
}
