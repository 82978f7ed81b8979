//! Test certificates: a private CA and a server certificate for 127.0.0.1 and localhost,
//! made with the `openssl` command.

use std::io;
use std::path::Path;
use std::process::Command;

/// Writes `ca.crt`, `ca.key`, `server.crt` and `server.key` into `dir`.
pub fn certificates(dir: &Path) -> io::Result<()> {
    let run = |args: &[&str]| -> io::Result<()> {
        let output = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()?;
        if output.status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            )))
        }
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=sluice-test-ca",
    ])?;
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ])?;
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )?;
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ])
}
