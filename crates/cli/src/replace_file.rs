//! Writing an output file whole or not at all.

use std::io::Write;
use std::path::Path;

/// Writes `contents` to `path` through a temporary file beside it, renamed over `path` at
/// the end: a failure (a missing directory, a full disk) leaves whatever was at `path`
/// untouched, and a reader never sees half a picture.
pub fn replace_file(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"))?;
    let mut temporary_name = std::ffi::OsString::from(".");
    temporary_name.push(name);
    temporary_name.push(format!(".{}.tmp", std::process::id()));
    let temporary = path.with_file_name(temporary_name);
    let written = std::fs::File::create(&temporary).and_then(|mut file| {
        file.write_all(contents)?;
        file.sync_all()
    });
    let renamed = written.and_then(|()| std::fs::rename(&temporary, path));
    if renamed.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    renamed
}
