//! For the targets that need a root-package feature they were built without
//! (`examples/cluster.rs` needs `etcd`, or `postgres` with `--postgres`;
//! `benches/compare.rs -- --etcd` needs `etcd`, `-- --postgres` needs `postgres`): both
//! are off by default, etcd-client's build needing `protoc`. [`rerun`] runs the same
//! target again through cargo with the feature, once it has checked that what the
//! feature's build needs is there.

use std::process::Command;

/// Runs `cargo SUBCOMMAND TARGET.. --features FEATURE -- ARGS..` in the root package and
/// exits with its status; for `etcd`, exits with 1 and the install command if `protoc`
/// is missing.
pub fn rerun(feature: &str, subcommand: &str, target: &[&str], args: &[String]) -> ! {
    let mut command = format!(
        "cargo {subcommand} {} --features {feature}",
        target.join(" ")
    );
    if !args.is_empty() {
        command = format!("{command} -- {}", args.join(" "));
    }
    if feature == "etcd" && !protoc_found() {
        eprintln!(
            "this needs the feature `etcd` ({command}), whose etcd-client builds with protoc, which is missing: \
             sudo apt-get install -y protobuf-compiler (scripts/install-test-deps.sh installs it and etcd-server)"
        );
        std::process::exit(1);
    }
    println!("built without the feature `{feature}`: running `{command}`");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg(subcommand)
        .args(target)
        .args(["--features", feature, "--"])
        .args(args)
        .status();
    match status {
        Ok(status) => std::process::exit(status.code().unwrap_or(1)),
        Err(error) => {
            eprintln!("could not run cargo: {error}");
            std::process::exit(1);
        }
    }
}

/// Whether etcd-client's build will find `protoc` (`PROTOC`, or on the `PATH`).
fn protoc_found() -> bool {
    std::env::var_os("PROTOC").is_some()
        || Command::new("protoc")
            .arg("--version")
            .output()
            .is_ok_and(|out| out.status.success())
}
