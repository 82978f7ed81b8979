//! What code under test logs through `tracing`, captured for assertions.

use std::io::Write;
use std::sync::{Arc, Mutex};

use tracing::subscriber::DefaultGuard;

/// The formatted log lines of this thread, from [`Captured::start`] until the guard drops.
/// (A `current_thread` tokio test runs all its tasks on its thread.)
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// Starts capturing this thread's events; keep the guard for as long as wanted.
    pub fn start() -> (Captured, DefaultGuard) {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        (captured, tracing::subscriber::set_default(subscriber))
    }

    /// How many lines contain `text`.
    pub fn lines_with(&self, text: &str) -> usize {
        let all = String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned();
        all.lines().filter(|l| l.contains(text)).count()
    }
}

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
