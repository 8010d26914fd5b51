//! gRPC clients other than Go's and tonic: CSI clients come in every
//! language, and C-core ones send the socket path as `:authority`.

use crate::common;

use std::process::Command;

use common::Driver;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpcio_with_default_settings_is_served() {
    let has_grpcio = Command::new("python3")
        .args(["-c", "import grpc"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_grpcio {
        common::skip("python3 with grpcio is not installed (pip install grpcio)");
        return;
    }
    let d = Driver::start(&[]).await;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/grpcio_default_authority.py"
    );
    let socket = d.socket.to_string_lossy().into_owned();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3").arg(script).arg(socket).output()
    })
    .await
    .unwrap()
    .expect("run python3");
    assert!(
        out.status.success(),
        "grpcio client failed:\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
}
