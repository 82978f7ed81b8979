//! A concurrency policy on a real axum server, driven over TCP: a download that is still
//! streaming holds its slot, one whose last chunk the client has seen has given it back, and
//! one whose client hung up gives it back when the server drops its body.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderName;
use axum::routing::get;
use bytes::Bytes;
use common::{clock, limiter};
use http_body::Frame;
use sluice_limiter::Policy;
use sluice_tower::{Key, RateLimitLayer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::sync::oneshot;

/// Streams what the test sends; tells the test when the server has dropped it.
struct Streamed {
    chunks: UnboundedReceiver<Bytes>,
    dropped: Option<oneshot::Sender<()>>,
}

impl http_body::Body for Streamed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.chunks
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}

impl Drop for Streamed {
    fn drop(&mut self) {
        if let Some(dropped) = self.dropped.take() {
            let _ = dropped.send(());
        }
    }
}

/// One download being served: its chunks, and the signal that the server dropped its body
/// (which happens after the layer's lease is released: the lease is dropped first).
struct Download {
    chunks: UnboundedSender<Bytes>,
    dropped: oneshot::Receiver<()>,
}

type Downloads = Arc<Mutex<Vec<Download>>>;

async fn serve(layer: RateLimitLayer) -> (SocketAddr, Downloads) {
    let downloads = Downloads::default();
    let app = Router::new()
        .route(
            "/download",
            get(|State(downloads): State<Downloads>| async move {
                let (chunks, rx) = unbounded_channel();
                let (signal, dropped) = oneshot::channel();
                downloads.lock().unwrap().push(Download { chunks, dropped });
                Body::new(Streamed {
                    chunks: rx,
                    dropped: Some(signal),
                })
            }),
        )
        .with_state(downloads.clone())
        .layer(layer);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = app.into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, service).await.unwrap() });
    (addr, downloads)
}

/// Reads from `stream` until `end` has arrived; answers everything read.
async fn read_until(stream: &mut TcpStream, end: &str) -> String {
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains(end) {
        let n = stream.read(&mut buffer).await.unwrap();
        assert!(
            n > 0,
            "closed before {end:?}: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buffer[..n]);
    }
    String::from_utf8(seen).unwrap()
}

/// Starts a download and reads its response head.
async fn start(addr: SocketAddr) -> (TcpStream, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = "GET /download HTTP/1.1\r\nhost: test\r\nx-user: alice\r\n\r\n";
    stream.write_all(request.as_bytes()).await.unwrap();
    let head = read_until(&mut stream, "\r\n\r\n").await;
    (stream, head.to_lowercase())
}

#[tokio::test]
async fn a_real_server_holds_the_slot_while_the_download_streams() {
    let clock = clock();
    let policy = Policy::new("downloads", "x:2 concurrent lease=30s").unwrap();
    let layer = RateLimitLayer::builder(limiter(&clock, vec![policy]), "downloads")
        .selector("x", Key::header(HeaderName::from_static("x-user")))
        .build()
        .unwrap();
    let (addr, downloads) = serve(layer).await;

    let (mut first, head) = start(addr).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let (second, head) = start(addr).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let (_, head) = start(addr).await;
    assert!(head.starts_with("http/1.1 429"), "{head}");
    assert!(head.contains("\r\nretry-after: 30\r\n"), "{head}");

    // The first download sends its last chunk; once the client has read the end of the
    // body, the slot is free (the layer releases before the end is written).
    let Download { chunks, .. } = downloads.lock().unwrap().remove(0);
    chunks.send(Bytes::from_static(b"all of it")).unwrap();
    drop(chunks);
    let rest = read_until(&mut first, "0\r\n\r\n").await;
    assert!(rest.contains("all of it"), "{rest}");
    let (_third, head) = start(addr).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let (_, head) = start(addr).await;
    assert!(
        head.starts_with("http/1.1 429"),
        "both slots held again: {head}"
    );

    // The second client hangs up mid-download: the server drops the body, and the lease
    // with it. Chunks keep coming so the server notices the closed connection on writing.
    let Download {
        chunks,
        mut dropped,
    } = downloads.lock().unwrap().remove(0);
    drop(second);
    let noticed = async {
        loop {
            if chunks.send(Bytes::from_static(b"more")).is_err() {
                return;
            }
            tokio::select! {
                _ = &mut dropped => return,
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), noticed)
        .await
        .expect("the server drops the body of a client that hung up");
    let (_fourth, head) = start(addr).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
}
