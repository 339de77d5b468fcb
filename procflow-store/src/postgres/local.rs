//! [`LocalPostgres`]: a real PostgreSQL server on 127.0.0.1, for tests and examples.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The command that installs PostgreSQL on the machines procflow is tested on (Debian).
pub const INSTALL_POSTGRES: &str = "sudo apt-get install -y postgresql";

/// The user [`LocalPostgres`] creates, trusted without a password on 127.0.0.1.
const USER: &str = "procflow";

/// Why a [`LocalPostgres`] could not start or change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LocalPostgresError {
    /// `initdb` and `postgres` are not installed (not in `$PG_BIN`, not under
    /// `/usr/lib/postgresql/*/bin`, not on `PATH`).
    #[error(
        "PostgreSQL's server binaries were not found ({0}); install them with: {INSTALL_POSTGRES}"
    )]
    Missing(String),
    /// `initdb`, the server, or waiting for it failed.
    #[error("PostgreSQL: {0}")]
    Server(String),
}

/// A PostgreSQL server of this machine's binaries, on 127.0.0.1 at a free port, with its
/// data in a temporary directory (made by `initdb`, user `procflow`, no password).
/// Dropping it kills the server by its pid (an immediate shutdown, then SIGKILL) and
/// removes the data, also when a test panics.
///
/// The binaries are those in `$PG_BIN` if set, else the newest
/// `/usr/lib/postgresql/*/bin` (Debian's layout), else `initdb` on `PATH`; if none is
/// there, [`start`](Self::start) fails with [`LocalPostgresError::Missing`], which names
/// the install command. PostgreSQL refuses to run as root: started by root, the server
/// runs as the `postgres` user the Debian package creates.
///
/// # Examples
///
/// ```
/// use procflow_store::postgres::{LocalPostgres, PgConfig, PgStore};
/// use procflow_store::{Batch, Store};
///
/// let server = LocalPostgres::start()?;
/// let config = PgConfig::new(server.connection_string(), "procedures");
/// tokio::runtime::Runtime::new()?.block_on(async {
///     let store = PgStore::connect(config).await?;
///     store.commit(Batch::new().put(1, None, b"step 1".to_vec())).await?;
///     assert_eq!(store.load().await?.records.len(), 1);
///     Ok::<_, procflow_store::StoreError>(())
/// })?;
/// // Dropping `server` kills it and removes its data.
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct LocalPostgres {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    /// The uid and gid the server runs as, if not this process's.
    owner: Option<(u32, u32)>,
    process: Option<Child>,
}

impl LocalPostgres {
    /// Runs `initdb`, starts the server and waits (up to 30 s) until it accepts
    /// connections.
    ///
    /// # Errors
    ///
    /// [`LocalPostgresError::Missing`] without the binaries; [`LocalPostgresError::Server`]
    /// if `initdb` fails or the server does not come up.
    pub fn start() -> Result<Self, LocalPostgresError> {
        let bin = binaries()?;
        let owner = server_owner()?;
        let dir = tempfile::Builder::new()
            .prefix("procflow-postgres-")
            .tempdir()
            .map_err(|e| server(format!("cannot create a data directory: {e}")))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .map_err(|e| server(format!("cannot give the data directory to uid {uid}: {e}")))?;
        }
        let mut postgres = Self {
            bin,
            dir,
            port: crate::free_local_port(),
            owner,
            process: None,
        };
        postgres.initdb()?;
        postgres.spawn()?;
        Ok(postgres)
    }

    /// The port the server listens on, on 127.0.0.1.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A libpq connection string for database `postgres` as the trusted user.
    #[must_use]
    pub fn connection_string(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user={USER} dbname=postgres",
            self.port
        )
    }

    /// The server's (postmaster's) process id, if it runs.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(Child::id)
    }

    /// Stops the server as a crash would (SIGQUIT: an immediate shutdown, no checkpoint,
    /// every connection cut; SIGKILL if it is still there after 5 s). Its data stays, for
    /// [`restart`](Self::restart), which then runs crash recovery.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            let _ = Command::new("kill")
                .args(["-QUIT", &process.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if matches!(process.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = process.kill();
            let _ = process.wait();
        }
    }

    /// [`kill`](Self::kill), then starts the server again on its data and port and waits
    /// until it accepts connections.
    ///
    /// # Errors
    ///
    /// [`LocalPostgresError::Server`] if it does not come back within 30 s.
    pub fn restart(&mut self) -> Result<(), LocalPostgresError> {
        self.kill();
        self.spawn()
    }

    /// The directory holding the data and the server's log (`server.log`).
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A command of the server's binaries, run as the server's owner.
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin.join(program));
        if let Some((uid, gid)) = self.owner {
            command.uid(uid).gid(gid);
        }
        command.current_dir(self.dir.path());
        command
    }

    fn initdb(&self) -> Result<(), LocalPostgresError> {
        let output = self
            .command("initdb")
            .arg("-D")
            .arg(self.data())
            .args([
                "-U",
                USER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| server(format!("cannot run initdb: {e}")))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(server(format!(
                "initdb exited with {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )))
        }
    }

    fn spawn(&mut self) -> Result<(), LocalPostgresError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("server.log"))
            .map_err(|e| server(format!("cannot open its log: {e}")))?;
        let process = self
            .command("postgres")
            .arg("-D")
            .arg(self.data())
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!(
                "unix_socket_directories={}",
                self.dir.path().display()
            ))
            .args(["-c", "max_connections=200"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| server(format!("cannot start postgres: {e}")))?;
        self.process = Some(process);
        self.wait_ready(Duration::from_secs(30))
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<(), LocalPostgresError> {
        let deadline = Instant::now() + timeout;
        loop {
            let ready = Command::new(self.bin.join("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return Ok(());
            }
            if let Some(process) = self.process.as_mut()
                && let Ok(Some(status)) = process.try_wait()
            {
                return Err(server(format!("exited with {status}; {}", self.log_tail())));
            }
            if Instant::now() > deadline {
                return Err(server(format!(
                    "not accepting connections after {timeout:?}; {}",
                    self.log_tail()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log_tail(&self) -> String {
        crate::server_log::log_tail(&self.dir.path().join("server.log"))
    }
}

impl Drop for LocalPostgres {
    fn drop(&mut self) {
        self.kill();
    }
}

fn server(message: String) -> LocalPostgresError {
    LocalPostgresError::Server(message)
}

/// The directory of `initdb`, `postgres` and `pg_isready`, looked for where
/// [`LocalPostgres`] says.
fn binaries() -> Result<PathBuf, LocalPostgresError> {
    find_binaries(
        std::env::var_os("PG_BIN").map(PathBuf::from),
        Path::new("/usr/lib/postgresql"),
        std::env::var_os("PATH"),
    )
}

/// [`binaries`] with its places given: `$PG_BIN`, Debian's root of majors
/// (`<root>/<major>/bin`, the newest first), and `$PATH`.
fn find_binaries(
    pg_bin: Option<PathBuf>,
    debian: &Path,
    path: Option<std::ffi::OsString>,
) -> Result<PathBuf, LocalPostgresError> {
    let has_initdb = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    if let Some(dir) = pg_bin {
        return if has_initdb(&dir) {
            Ok(dir)
        } else {
            Err(LocalPostgresError::Missing(format!(
                "$PG_BIN is {}, which holds no initdb and postgres",
                dir.display()
            )))
        };
    }
    let mut majors: Vec<(u32, PathBuf)> = std::fs::read_dir(debian)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let major = entry.file_name().to_str()?.parse().ok()?;
            Some((major, entry.path().join("bin")))
        })
        .filter(|(_, bin)| has_initdb(bin))
        .collect();
    majors.sort();
    if let Some((_, bin)) = majors.pop() {
        return Ok(bin);
    }
    let on_path = path
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .find(|dir| has_initdb(dir));
    on_path.ok_or_else(|| {
        LocalPostgresError::Missing(format!(
            "no initdb in $PG_BIN, {}/*/bin or on PATH",
            debian.display()
        ))
    })
}

/// Whom the server runs as: `None` (this process's user) unless this process is root,
/// which PostgreSQL refuses; then the `postgres` user.
fn server_owner() -> Result<Option<(u32, u32)>, LocalPostgresError> {
    // The owner of /proc/self is this process's effective uid.
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    if !root {
        return Ok(None);
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .map(|line| line.split(':').collect::<Vec<_>>())
        .find(|fields| fields.first() == Some(&"postgres"))
        .and_then(|fields| Some((fields.get(2)?.parse().ok()?, fields.get(3)?.parse().ok()?)))
        .map(Some)
        .ok_or_else(|| {
            LocalPostgresError::Server(format!(
                "running as root, PostgreSQL needs another user, and there is no `postgres` \
                 user (the package creates it: {INSTALL_POSTGRES})"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bin_dir(root: &Path, name: &str) -> PathBuf {
        let dir = root.join(name).join("bin");
        std::fs::create_dir_all(&dir).unwrap();
        for program in ["initdb", "postgres"] {
            std::fs::write(dir.join(program), b"").unwrap();
        }
        dir
    }

    #[test]
    fn missing_binaries_fail_naming_the_install_command() {
        let empty = tempfile::tempdir().unwrap();
        let error = find_binaries(None, empty.path(), Some("/nonexistent".into())).unwrap_err();
        let message = error.to_string();
        assert!(matches!(error, LocalPostgresError::Missing(_)), "{message}");
        assert!(
            message.contains("sudo apt-get install -y postgresql"),
            "{message}"
        );
        let error = find_binaries(Some(empty.path().into()), empty.path(), None).unwrap_err();
        assert!(error.to_string().contains("$PG_BIN is"), "{error}");
    }

    #[test]
    fn the_newest_debian_major_wins_and_pg_bin_comes_first() {
        let root = tempfile::tempdir().unwrap();
        bin_dir(root.path(), "9");
        let newest = bin_dir(root.path(), "15");
        assert_eq!(find_binaries(None, root.path(), None).unwrap(), newest);
        let chosen = bin_dir(root.path(), "chosen");
        let found = find_binaries(Some(chosen.clone()), root.path(), None).unwrap();
        assert_eq!(found, chosen);
    }
}
