//! A partition between a process and an API server, on 127.0.0.1: a TCP
//! proxy that forwards until it is cut, and while cut holds every
//! connection open and answers nothing, new ones included: the process
//! sees hung calls, not refusals. What was sent during the cut is held,
//! not lost, and flows once healed, as TCP delivers it after a partition
//! that outlasted no retransmission. `kubeconfig` writes a copy of a
//! kubeconfig whose server is the proxy (the API server's certificate
//! names 127.0.0.1, so TLS still verifies).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct FaultProxy {
    pub addr: SocketAddr,
    upstream: String,
    cut: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// A proxy to `upstream` (`host:port`), forwarding.
    pub async fn to(upstream: &str) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fault proxy");
        let addr = listener.local_addr().expect("fault proxy address");
        let (cut, _) = watch::channel(false);
        let (to, state) = (upstream.to_string(), cut.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let (to, state) = (to.clone(), state.subscribe());
                tokio::spawn(async move {
                    // A connection opened while cut waits, open and silent.
                    let mut connect_state = state.clone();
                    if connect_state.wait_for(|cut| !*cut).await.is_err() {
                        return;
                    }
                    let Ok(server) = TcpStream::connect(&to).await else {
                        return;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::select! {
                        _ = pipe(client_read, server_write, state.clone()) => {}
                        _ = pipe(server_read, client_write, state) => {}
                    }
                });
            }
        });
        FaultProxy {
            addr,
            upstream: upstream.to_string(),
            cut,
            task,
        }
    }

    /// Black-holes every connection, held and new, until `heal`.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    pub fn heal(&self) {
        self.cut.send_replace(false);
    }

    /// A copy of the kubeconfig at `original`, at `into`, whose cluster
    /// server is this proxy instead of the upstream.
    pub fn kubeconfig(&self, original: &str, into: &Path) -> PathBuf {
        let text = std::fs::read_to_string(original).expect("read the kubeconfig");
        let upstream = format!("https://{}", self.upstream);
        assert!(
            text.contains(&upstream),
            "{original} does not name {upstream} as its server"
        );
        let proxied = text.replace(&upstream, &format!("https://{}", self.addr));
        std::fs::write(into, proxied).expect("write the proxied kubeconfig");
        into.to_path_buf()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to`; while cut, what was read waits unsent and
/// nothing more is read.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut cut: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if cut.wait_for(|cut| !*cut).await.is_err() {
            return;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            // Cut while waiting to read: stop reading until healed.
            _ = cut.wait_for(|cut| *cut) => continue,
        };
        if cut.wait_for(|cut| !*cut).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// The `host:port` of the server a kubeconfig names (its first cluster).
pub fn server_of(kubeconfig: &str) -> String {
    let text = std::fs::read_to_string(kubeconfig).expect("read the kubeconfig");
    let server = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server:"))
        .expect("a server in the kubeconfig")
        .trim()
        .trim_matches('"');
    server
        .strip_prefix("https://")
        .unwrap_or(server)
        .trim_end_matches('/')
        .to_string()
}
