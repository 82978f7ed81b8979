//! The AFL++ harness: `sluice-fuzz TARGET` reads inputs from AFL++ (in persistent mode) and
//! runs them through the named target. See `fuzz/README.md`.

use sluice_fuzz::Target;

fn main() {
    let name = std::env::args().nth(1).unwrap_or_default();
    let Some(target) = Target::from_name(&name) else {
        let names: Vec<_> = Target::ALL.iter().map(|t| t.name()).collect();
        eprintln!("usage: sluice-fuzz TARGET, one of: {}", names.join(", "));
        std::process::exit(2);
    };
    afl::fuzz!(|data: &[u8]| target.run(data));
}
