//! `csi-sanity/spec.sh`: which CSI spec csi-relay advertises to a given
//! csi-sanity binary. The binaries here are stand-ins that carry the same
//! strings the real suites compile in (checked against csi-test's tags
//! v3.0.0 to v5.4.0 and master) and print what `--version` prints there.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

const CONTROLLER: &str = "Controller Service [Controller Server]";
const GET_SNAPSHOT_SPECS: &str = "GetSnapshot [Controller Server]";
const GET_SNAPSHOT_CAP: &str = "GET_SNAPSHOT";

/// A binary that prints `Version = VERSION` and holds `strings`.
fn stand_in(dir: &Path, name: &str, version: &str, strings: &[&str]) -> String {
    let path = dir.join(name);
    let mut body = format!("#!/bin/sh\necho 'Version = {version}'\nexit 0\n");
    for s in strings {
        body.push_str(&format!("# {s}\n"));
    }
    std::fs::write(&path, body).expect("write stand-in");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path.display().to_string()
}

/// (exit code, stdout, stderr) of spec.sh for `binary`.
fn spec(binary: &str) -> (i32, String, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("csi-sanity/spec.sh");
    let out = Command::new("bash")
        .arg(script)
        .arg(binary)
        .output()
        .expect("run spec.sh");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn a_release_build_is_told_by_its_suite_not_its_version_string() {
    let dir = tempfile::tempdir().expect("tempdir");
    // kubernetes-csi's release tooling sets main.version; csi-sanity prints
    // main.VERSION, so both of these say "(dev)".
    let v540 = stand_in(
        dir.path(),
        "v5.4.0",
        "(dev)",
        &[CONTROLLER, GET_SNAPSHOT_CAP],
    );
    let master = stand_in(
        dir.path(),
        "master",
        "(dev)",
        &[CONTROLLER, GET_SNAPSHOT_CAP, GET_SNAPSHOT_SPECS],
    );
    let v531 = stand_in(dir.path(), "v5.3.1", "(dev)", &[CONTROLLER]);
    assert_eq!(spec(&v540).0, 0);
    assert_eq!(
        spec(&v540).1,
        "1.10",
        "v5.4.0 is built on spec v1.12 but refuses GET_SNAPSHOT"
    );
    assert_eq!(spec(&master).1, "1.12");
    assert_eq!(spec(&v531).1, "1.10");
}

#[test]
fn a_version_string_agrees_with_the_suite_or_nothing_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tagged = stand_in(dir.path(), "a", "v5.4.0", &[CONTROLLER, GET_SNAPSHOT_CAP]);
    assert_eq!(spec(&tagged).1, "1.10");
    let past = stand_in(
        dir.path(),
        "b",
        "v5.4.0-14-g2f1e2f2a",
        &[CONTROLLER, GET_SNAPSHOT_CAP, GET_SNAPSHOT_SPECS],
    );
    assert_eq!(spec(&past).1, "1.12");
    let newer = stand_in(
        dir.path(),
        "c",
        "v5.5.0",
        &[CONTROLLER, GET_SNAPSHOT_CAP, GET_SNAPSHOT_SPECS],
    );
    assert_eq!(spec(&newer).1, "1.12");

    // A tag of v5.4 or older cannot hold the later specs, and a release
    // after v5.4 cannot lack them: the binary is not what it says.
    let lying_old = stand_in(
        dir.path(),
        "d",
        "v5.4.0",
        &[CONTROLLER, GET_SNAPSHOT_CAP, GET_SNAPSHOT_SPECS],
    );
    let (code, out, err) = spec(&lying_old);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert!(err.contains("cannot tell the CSI spec"), "{err}");
    let lying_new = stand_in(dir.path(), "e", "v5.5.0", &[CONTROLLER, GET_SNAPSHOT_CAP]);
    let (code, _, err) = spec(&lying_new);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("lacks the GetSnapshot specs"), "{err}");
}

#[test]
fn a_binary_without_a_sanity_suite_stops_the_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let other = stand_in(dir.path(), "other", "v5.4.0", &[GET_SNAPSHOT_CAP]);
    let (code, out, err) = spec(&other);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert!(err.contains("holds no csi-sanity suite"), "{err}");
    let (code, _, err) = spec(&dir.path().join("missing").display().to_string());
    assert_eq!(code, 2);
    assert!(err.contains("not an executable file"), "{err}");
}
