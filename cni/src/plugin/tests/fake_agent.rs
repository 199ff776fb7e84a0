//! A fake agent on a unix socket that answers canned HTTP responses and records what it was
//! asked, so a command's requests are checked as the agent would receive them.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    os::unix::net::UnixListener,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    thread::JoinHandle,
};

use serde_json::Value;

/// A fake agent on a unix socket: answers `responses` in order, one per connection.
pub(super) struct FakeAgent {
    pub(super) socket: PathBuf,
    requests: Arc<Mutex<Vec<(String, String)>>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeAgent {
    pub(super) fn start(dir: &Path, responses: Vec<(u16, Value)>) -> FakeAgent {
        let socket = dir.join("fake.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let thread = std::thread::spawn(move || {
            for (status, body) in responses {
                let (stream, _) = listener.accept().unwrap();
                let mut reader = BufReader::new(stream);
                let mut request_line = String::new();
                reader.read_line(&mut request_line).unwrap();
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    if line == "\r\n" || line.is_empty() {
                        break;
                    }
                    if let Some((k, v)) = line.split_once(':') {
                        if k.eq_ignore_ascii_case("content-length") {
                            length = v.trim().parse().unwrap();
                        }
                    }
                }
                let mut request_body = vec![0; length];
                reader.read_exact(&mut request_body).unwrap();
                seen.lock().unwrap().push((
                    request_line.trim().to_owned(),
                    String::from_utf8(request_body).unwrap(),
                ));
                let body = body.to_string();
                let mut stream = reader.into_inner();
                write!(
                    stream,
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
                .unwrap();
            }
        });
        FakeAgent {
            socket,
            requests,
            thread: Some(thread),
        }
    }

    /// Every (request line, body) it was sent, once it answered them all.
    pub(super) fn finish(mut self) -> Vec<(String, String)> {
        self.thread.take().unwrap().join().unwrap();
        self.requests.lock().unwrap().clone()
    }
}
