//! A minimal keep-alive HTTP/1.1 responder for the data-plane benchmark: every request gets
//! `200 OK` and two bytes, so the servers cost little next to the path being measured.

use std::{
    io::{BufRead, BufReader, Write},
    net::TcpListener,
};

fn main() {
    let port: u16 = std::env::args().nth(1).and_then(|p| p.parse().ok()).unwrap_or(8080);
    let listener = TcpListener::bind(("0.0.0.0", port)).expect("binding the responder");
    for stream in listener.incoming().flatten() {
        std::thread::spawn(move || {
            let mut writer = stream.try_clone().expect("cloning the stream");
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            loop {
                line.clear();
                match reader.read_line(&mut line) {
                    Ok(0) | Err(_) => return,
                    // The blank line ends a request's headers.
                    Ok(_) if line == "\r\n" => {
                        if writer.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                }
            }
        });
    }
}
