//! The JSON-lines file sink: a thread of its own (a slow or stuck disk blocks only it),
//! one `write` per batch, rotation by size.
//!
//! Rotation renames `path.<keep-1>` to `path.<keep>` (the old `path.<keep>` goes), ...,
//! `path` to `path.1`, then starts a new `path`; with `keep = 0` the file starts afresh.
//! Only regular files rotate: a FIFO or a device (`/dev/stdout`) is written as it is.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::{BATCH, DenialRecord, SinkCounters};
use crate::config::audit::FileSink;

struct Writer {
    path: PathBuf,
    max_bytes: u64,
    keep: u32,
    file: File,
    /// Bytes in the current file.
    size: u64,
    regular: bool,
    /// Whether the last write failed: errors are logged when they start and stop, not
    /// once per batch.
    failing: bool,
}

/// Opens the file (append, created when missing) and starts the writer thread.
pub(super) fn spawn(
    sink: &FileSink,
    server: String,
    mut receiver: mpsc::Receiver<Arc<DenialRecord>>,
    counters: Arc<SinkCounters>,
    done: oneshot::Sender<()>,
) -> io::Result<()> {
    let file = open(&sink.path)?;
    let meta = file.metadata()?;
    let mut writer = Writer {
        path: sink.path.clone(),
        max_bytes: sink.max_bytes,
        keep: sink.keep,
        regular: meta.is_file(),
        size: meta.len(),
        file,
        failing: false,
    };
    std::thread::Builder::new()
        .name("sluice-audit-file".into())
        .spawn(move || {
            let mut batch = Vec::with_capacity(BATCH);
            let mut bytes = Vec::with_capacity(BATCH * 200);
            while let Some(first) = receiver.blocking_recv() {
                batch.push(first);
                while batch.len() < BATCH {
                    match receiver.try_recv() {
                        Ok(record) => batch.push(record),
                        Err(_) => break,
                    }
                }
                writer.write_batch(&batch, &server, &mut bytes, &counters);
                batch.clear();
            }
            let _ = done.send(());
        })?;
    Ok(())
}

fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

impl Writer {
    /// Writes the batch in as few writes as the size bound allows: lines are gathered until
    /// the next would take the file past `max_bytes`, then written, and the file rotated.
    fn write_batch(
        &mut self,
        batch: &[Arc<DenialRecord>],
        server: &str,
        bytes: &mut Vec<u8>,
        counters: &SinkCounters,
    ) {
        bytes.clear();
        let mut records = 0;
        for record in batch {
            let start = bytes.len();
            record.write_json_line(server, bytes);
            let full = self.size + bytes.len() as u64 > self.max_bytes;
            if self.regular && full && start > 0 {
                self.write(&bytes[..start], records, counters);
                bytes.drain(..start);
                records = 0;
            }
            records += 1;
        }
        if !bytes.is_empty() {
            self.write(bytes, records, counters);
        }
    }

    fn write(&mut self, bytes: &[u8], records: usize, counters: &SinkCounters) {
        if self.regular && self.size > 0 && self.size + bytes.len() as u64 > self.max_bytes {
            if let Err(error) = self.rotate() {
                tracing::error!(path = %self.path.display(), %error, "audit file: cannot rotate; writing on");
            }
        }
        match self.file.write_all(bytes) {
            Ok(()) => {
                self.size += bytes.len() as u64;
                counters.add_written(records);
                if self.failing {
                    self.failing = false;
                    tracing::info!(path = %self.path.display(), "audit file: writing again");
                }
            }
            Err(error) => {
                counters.add_failed(records);
                if !self.failing {
                    self.failing = true;
                    tracing::error!(path = %self.path.display(), %error, "audit file: cannot write; denials are dropped (sluice_audit_dropped_total) until it can");
                }
            }
        }
    }

    fn rotate(&mut self) -> io::Result<()> {
        let numbered = |n: u32| {
            let mut name = self.path.clone().into_os_string();
            name.push(format!(".{n}"));
            PathBuf::from(name)
        };
        if self.keep == 0 {
            std::fs::remove_file(&self.path).or_else(missing_is_fine)?;
        } else {
            std::fs::remove_file(numbered(self.keep)).or_else(missing_is_fine)?;
            for n in (1..self.keep).rev() {
                std::fs::rename(numbered(n), numbered(n + 1)).or_else(missing_is_fine)?;
            }
            std::fs::rename(&self.path, numbered(1))?;
        }
        self.file = open(&self.path)?;
        self.size = 0;
        Ok(())
    }
}

fn missing_is_fine(error: io::Error) -> io::Result<()> {
    if error.kind() == io::ErrorKind::NotFound {
        Ok(())
    } else {
        Err(error)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    fn record(i: u64) -> Arc<DenialRecord> {
        Arc::new(DenialRecord {
            at: UNIX_EPOCH + Duration::from_secs(1_700_000_000 + i),
            policy: "login".into(),
            leaf: "ip:5/m".into(),
            selectors: vec![("ip".into(), format!("10.0.0.{i}"))],
            reason: "limited",
            retry_after: Some(Duration::from_secs(1)),
        })
    }

    /// Each batch is one write, so the test sends one record at a time and waits for it
    /// to be counted before the next (rotation is checked per write).
    #[test]
    fn rotates_by_size_and_keeps_keep_files() {
        let dir = std::env::temp_dir().join(format!("sluice-audit-rotate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("denials.jsonl");
        let mut line = Vec::new();
        record(1).write_json_line("s", &mut line);
        let sink = FileSink {
            path: path.clone(),
            // Three lines per file.
            max_bytes: line.len() as u64 * 3,
            keep: 2,
        };
        let (sender, receiver) = mpsc::channel(16);
        let counters = Arc::new(SinkCounters::default());
        let (done, finished) = oneshot::channel();
        spawn(&sink, "s".into(), receiver, counters.clone(), done).unwrap();
        for i in 0..20 {
            sender.blocking_send(record(i % 10)).unwrap();
            while counters.written() < i + 1 {
                std::thread::yield_now();
            }
        }
        drop(sender);
        finished.blocking_recv().unwrap();
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["denials.jsonl", "denials.jsonl.1", "denials.jsonl.2"]
        );
        let lines = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .unwrap()
                .lines()
                .count()
        };
        // 20 lines, 3 per file: the current file holds the last 2, the kept ones 3 each.
        assert_eq!(lines("denials.jsonl"), 2);
        assert_eq!(lines("denials.jsonl.1"), 3);
        assert_eq!(lines("denials.jsonl.2"), 3);
        let newest = std::fs::read_to_string(&path).unwrap();
        assert!(newest.contains("10.0.0.9"), "{newest}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
