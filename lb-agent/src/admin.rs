//! The client side of the agent's admin socket (see `http`): `lb-agent status` and
//! `lb-agent log-level` on the node.

use std::{
    io::{Read, Write},
    os::unix::net::UnixStream,
    path::Path,
    time::Duration,
};

/// GETs `path` from the agent at `socket`; the body, or why not.
pub fn get(socket: &Path, path: &str) -> Result<String, String> {
    request(socket, "GET", path, "")
}

/// Sends one request to the agent at `socket`: the body of a 200 answer, or an error that says
/// what failed (the socket, or the agent's answer).
pub fn request(socket: &Path, method: &str, path: &str, body: &str) -> Result<String, String> {
    let unreachable = |e: std::io::Error| {
        format!(
            "cannot reach the agent at {} ({e}); is it running on this node, is `adminSocket` this path \
             (--socket), and are you root?",
            socket.display()
        )
    };
    let mut stream = UnixStream::connect(socket).map_err(unreachable)?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).map_err(unreachable)?;
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: lb-agent\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .map_err(unreachable)?;
    let mut response = String::new();
    stream.read_to_string(&mut response).map_err(unreachable)?;
    let (head, body) = response.split_once("\r\n\r\n").ok_or("a malformed HTTP response from the agent")?;
    let status = head.lines().next().unwrap_or_default();
    if status.split(' ').nth(1) != Some("200") {
        return Err(format!("the agent answered {status}: {}", body.trim_end()));
    }
    Ok(body.to_owned())
}
