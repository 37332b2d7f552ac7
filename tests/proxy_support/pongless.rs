//! A TCP relay in front of a backend that drops every WebSocket pong the
//! backend sends: the daemon meets a backend that answers no ping (which
//! its link must survive: docs/proxy.md, "The link").

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Listens on loopback, relays each connection to `backend`, and returns
/// the URL to give the daemon instead of the backend's.
pub async fn relay(backend: std::net::SocketAddr) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://127.0.0.1:{}/ws/agent", listener.local_addr().unwrap().port());
    tokio::spawn(async move {
        while let Ok((daemon, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(backend).await else { continue };
            let (mut dr, mut dw) = daemon.into_split();
            let (mut sr, mut sw) = server.into_split();
            tokio::spawn(async move { tokio::io::copy(&mut dr, &mut sw).await });
            tokio::spawn(async move {
                let mut filter = Filter::default();
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match sr.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if dw.write_all(&filter.feed(&buf[..n])).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    url
}

/// The server's side of a WebSocket after the HTTP upgrade: unmasked
/// frames, passed on unless they are pongs (opcode 0xA).
#[derive(Default)]
struct Filter {
    upgraded: bool,
    pending: Vec<u8>,
}

impl Filter {
    fn feed(&mut self, data: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(data);
        let mut out = Vec::new();
        if !self.upgraded {
            let Some(end) = self.pending.windows(4).position(|w| w == b"\r\n\r\n") else { return out };
            out.extend(self.pending.drain(..end + 4));
            self.upgraded = true;
        }
        while let Some(len) = frame_len(&self.pending) {
            let frame: Vec<u8> = self.pending.drain(..len).collect();
            if frame[0] & 0x0f != 0x0a {
                out.extend(frame);
            }
        }
        out
    }
}

/// The length of the whole frame at the start of `b`, once all of it is there.
fn frame_len(b: &[u8]) -> Option<usize> {
    let (head, payload) = match *b.get(1)? & 0x7f {
        126 => (4, u16::from_be_bytes(b.get(2..4)?.try_into().unwrap()) as usize),
        127 => (10, u64::from_be_bytes(b.get(2..10)?.try_into().unwrap()) as usize),
        n => (2, n as usize),
    };
    let mask = if b[1] & 0x80 != 0 { 4 } else { 0 };
    let len = head + mask + payload;
    (b.len() >= len).then_some(len)
}
