//! A byte stream to one port of a pod, through its API server's
//! `pods/portforward` (WebSocket, the `v4.channel.k8s.io` framing: one
//! channel byte, then data; each channel's first message is its port).
//!
//! Why not kube's `Portforwarder`: it reads what goes to the pod 4 KiB at a
//! time and sends each piece as a WebSocket message of its own, flushed, so
//! a mover's 1 MiB chunk crosses TLS, the API server, the kubelet and the
//! runtime's stream server as 256 messages (and a frame's 2-byte length as
//! one more). Here a message carries everything waiting to go, up to
//! `MESSAGE` bytes. The gain is measured in docs/members.md ("Volumes that
//! move", the copy's throughput).

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::{FutureExt, SinkExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Resource;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::task::AbortHandle;
use tokio_tungstenite::tungstenite::Message;

/// The most one WebSocket message to the pod carries.
const MESSAGE: usize = 1 << 20;
/// Bytes buffered each way between the caller and the WebSocket.
const BUFFER: usize = 4 << 20;
/// The data channel of the first (only) port; its error channel is 1.
const DATA: u8 = 0;
const ERROR: u8 = 1;

/// The stream; dropping it closes the port-forward.
pub struct PortStream {
    io: DuplexStream,
    tasks: [AbortHandle; 2],
}

impl Drop for PortStream {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl AsyncRead for PortStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for PortStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Opens a port-forward to `port` of pod `ns/pod`. What the kubelet says
/// on the error channel (no listener on the port, say) is logged, and the
/// stream then ends.
pub async fn open(
    client: kube::Client,
    ns: &str,
    pod: &str,
    port: u16,
) -> Result<PortStream, kube::Error> {
    let request = kube::core::Request::new(Pod::url_path(&(), Some(ns)))
        .portforward(pod, &[port])
        .map_err(kube::Error::BuildRequest)?;
    let ws = client.connect(request).await?.into_stream();
    let (sink, stream) = ws.split();
    let (ours, theirs) = tokio::io::duplex(BUFFER);
    let (from_caller, to_caller) = tokio::io::split(theirs);
    let what = format!("port-forward to {ns}/{pod}:{port}");
    let up = tokio::spawn(to_pod(from_caller, sink));
    let down = tokio::spawn(from_pod(stream, to_caller, port, what));
    Ok(PortStream {
        io: ours,
        tasks: [up.abort_handle(), down.abort_handle()],
    })
}

/// The caller's bytes to the pod: each message takes what is waiting.
async fn to_pod<R, S>(mut from: R, mut sink: S)
where
    R: AsyncRead + Unpin,
    S: futures::Sink<Message> + Unpin,
{
    let mut buf = vec![0u8; MESSAGE + 1];
    loop {
        buf[0] = DATA;
        let mut n = match from.read(&mut buf[1..]).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // What the caller wrote meanwhile goes in the same message.
        while n < MESSAGE {
            match from.read(&mut buf[1 + n..]).now_or_never() {
                Some(Ok(m)) if m > 0 => n += m,
                _ => break,
            }
        }
        if sink
            .send(Message::binary(buf[..=n].to_vec()))
            .await
            .is_err()
        {
            return;
        }
    }
    let _ = sink.close().await;
}

/// The pod's bytes to the caller. Each channel's first message is its
/// port (2 bytes, little-endian); the error channel's next is the
/// kubelet's reason.
async fn from_pod<S, W>(mut stream: S, mut to: W, port: u16, what: String)
where
    S: futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut started = [false; 2];
    while let Some(Ok(msg)) = stream.next().await {
        let data = match msg {
            Message::Binary(data) => data,
            Message::Close(_) => break,
            _ => continue,
        };
        let Some((&channel, body)) = data.split_first() else {
            continue;
        };
        let Some(seen) = started.get_mut(usize::from(channel)) else {
            tracing::warn!(%what, channel, "port-forward: a message on an unknown channel");
            break;
        };
        if !*seen {
            *seen = true;
            if body != port.to_le_bytes() {
                tracing::warn!(%what, "port-forward: the channel opened for another port");
                break;
            }
            continue;
        }
        if channel == ERROR {
            let why = String::from_utf8_lossy(body);
            tracing::warn!(%what, error = %why, "port-forward: the kubelet refused");
            break;
        }
        if to.write_all(body).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(channel: u8, body: &[u8]) -> Result<Message, tokio_tungstenite::tungstenite::Error> {
        let mut v = vec![channel];
        v.extend_from_slice(body);
        Ok(Message::binary(v))
    }

    #[tokio::test]
    async fn from_pod_skips_each_channels_port_and_stops_at_an_error() {
        let port = 7878u16;
        let msgs = vec![
            framed(DATA, &port.to_le_bytes()),
            framed(ERROR, &port.to_le_bytes()),
            framed(DATA, b"hello "),
            framed(DATA, b"world"),
            framed(ERROR, b"connection refused"),
            framed(DATA, b"never"),
        ];
        let (mut ours, theirs) = tokio::io::duplex(1024);
        from_pod(futures::stream::iter(msgs), theirs, port, "t".into()).await;
        let mut got = String::new();
        ours.read_to_string(&mut got).await.expect("read");
        assert_eq!(got, "hello world");
    }

    #[tokio::test]
    async fn from_pod_refuses_a_channel_opened_for_another_port() {
        let msgs = vec![framed(DATA, &1u16.to_le_bytes()), framed(DATA, b"x")];
        let (mut ours, theirs) = tokio::io::duplex(1024);
        from_pod(futures::stream::iter(msgs), theirs, 2, "t".into()).await;
        let mut got = Vec::new();
        ours.read_to_end(&mut got).await.expect("read");
        assert!(got.is_empty());
    }

    #[tokio::test]
    async fn to_pod_sends_what_waits_in_one_message_on_the_data_channel() {
        let (mut caller, theirs) = tokio::io::duplex(BUFFER);
        // Written in small pieces before the task reads: one message.
        for piece in [&b"ab"[..], b"cd", b"ef"] {
            caller.write_all(piece).await.expect("write");
        }
        drop(caller);
        let (tx, rx) = futures::channel::mpsc::unbounded::<Message>();
        to_pod(theirs, tx.sink_map_err(|_| ())).await;
        let sent: Vec<Message> = rx.collect().await;
        assert_eq!(sent, vec![Message::binary(b"\0abcdef".to_vec())]);
    }
}
