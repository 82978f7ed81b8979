//! The soak: two `sluice serve` processes sharing one Redis, under steady load for a given
//! time, with a fault every minute (in turn: a config reload on both, every client
//! connection killed on the Redis side, Redis itself killed and restarted, a quiet minute).
//! Each minute it prints one row: decisions, latency, exactness, and the servers' resident
//! memory and open files, so a leak or a drift shows as a trend. Run by `scripts/soak.sh`.
//!
//! Exactness: the load goes in rounds, each on a fresh key of limit `LIMIT` per hour, with
//! `HITS` hits spread over both servers at once. A round admits exactly `LIMIT` unless a
//! fault touched it; the policy fails closed, so an outage can only admit fewer, and only a
//! Redis restart (which forgets the counters) can admit more.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_testkit::http::{Http1, resident_bytes};
use sluice_testkit::redis::RedisServer;

const LIMIT: usize = 100;
const HITS: usize = 150;

const POLICIES: &str = "# The soak's policy: exact, and closed while the store is away.\n\
[policies.soak]\n\
rule = \"user:100/h\"\n\
algorithm = \"fixed-window\"\n\
failure = \"closed\"\n";

struct Sluice {
    child: Child,
    base: String,
}

impl Sluice {
    fn start(binary: &str, config: &std::path::Path, store: &str) -> Sluice {
        let mut child = Command::new(binary)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--store",
                store,
                "--config",
            ])
            .arg(config)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("sluice's first line");
        let base = line
            .trim()
            .strip_prefix("sluice listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        Sluice { child, base }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.pid().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal} {}", self.pid());
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// What the load saw in one minute.
#[derive(Default)]
struct Minute {
    latencies: Vec<f64>,
    exact: usize,
    under: usize,
    over: usize,
    most: usize,
    errors: usize,
}

/// `90s`, `30m`, `2h`.
fn duration(text: &str) -> Option<Duration> {
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit())?);
    let n: u64 = number.parse().ok()?;
    Some(Duration::from_secs(match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return None,
    }))
}

fn percentile(sorted: &[f64], p: usize) -> f64 {
    sorted
        .get(sorted.len() * p / 100)
        .copied()
        .unwrap_or(f64::NAN)
}

/// One round: `HITS` hits on `key`, half through each server, at once; the admitted count,
/// or `None` when a request failed outright.
fn round(bases: &[String; 2], key: &str, latencies: &mut Vec<f64>) -> Option<usize> {
    let body = format!(r#"{{"policy":"soak","selectors":{{"user":"{key}"}}}}"#);
    let results: Vec<Option<(usize, Vec<f64>)>> = std::thread::scope(|scope| {
        let halves: Vec<_> = bases
            .iter()
            .map(|base| {
                let body = &body;
                scope.spawn(move || {
                    std::panic::catch_unwind(|| {
                        let mut client = Http1::connect(base);
                        let mut admitted = 0;
                        let mut times = Vec::with_capacity(HITS / 2);
                        for _ in 0..HITS / 2 {
                            let started = Instant::now();
                            let (status, answer) = client.request("POST", "/v1/check", body);
                            times.push(started.elapsed().as_secs_f64() * 1e3);
                            assert_eq!(status, 200, "{answer}");
                            admitted += usize::from(answer.starts_with(r#"{"allowed":true"#));
                        }
                        (admitted, times)
                    })
                    .ok()
                })
            })
            .collect();
        halves
            .into_iter()
            .map(|h| h.join().ok().flatten())
            .collect()
    });
    let mut admitted = 0;
    for result in results {
        let (n, times) = result?;
        admitted += n;
        latencies.extend(times);
    }
    Some(admitted)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(total), Some(binary)) = (args.get(1).and_then(|d| duration(d)), args.get(2)) else {
        eprintln!("usage: sluice-soak DURATION (90s, 30m, 2h) PATH/TO/sluice");
        std::process::exit(2);
    };
    // Quiet panics: a request cut by a fault is counted, not printed.
    std::panic::set_hook(Box::new(|_| {}));

    let mut redis = RedisServer::start().expect("redis-server");
    let dir = std::env::temp_dir().join(format!("sluice-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let config = dir.join("policies.toml");
    std::fs::write(&config, POLICIES).expect("the config");
    let store = format!("{}?timeout_ms=500", redis.url());
    let servers = [
        Sluice::start(binary, &config, &store),
        Sluice::start(binary, &config, &store),
    ];
    let bases = [servers[0].base.clone(), servers[1].base.clone()];

    let minute = Arc::new(Mutex::new(Minute::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let load = std::thread::spawn({
        let (minute, stop) = (minute.clone(), stop.clone());
        move || {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                let mut latencies = Vec::new();
                let admitted = round(&bases, &format!("round-{n}"), &mut latencies);
                let mut m = minute.lock().expect("the minute");
                m.latencies.extend(latencies);
                match admitted {
                    None => m.errors += 1,
                    Some(a) if a == LIMIT => m.exact += 1,
                    Some(a) if a < LIMIT => m.under += 1,
                    Some(_) => m.over += 1,
                }
                m.most = m.most.max(admitted.unwrap_or(0));
            }
        }
    });

    println!(
        "| minute | fault | decisions | p50 ms | p99 ms | rounds exact / under / over / failed | most admitted (limit {LIMIT}) | RSS MiB A / B | open files A / B |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let started = Instant::now();
    let minutes = total.as_secs().div_ceil(60).max(1);
    for i in 1..=minutes {
        let fault = match i % 4 {
            1 => {
                // A real change, so the reload is not skipped as a no-op.
                let text = format!("{POLICIES}# reload {i}\n");
                std::fs::write(&config, text).expect("the config");
                servers.iter().for_each(|s| s.signal("-HUP"));
                "reload"
            }
            2 => {
                let _ = redis.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
                "connections killed"
            }
            3 => {
                redis.kill();
                redis.restart().expect("redis-server restarted");
                "Redis restarted"
            }
            _ => "none",
        };
        let until = started + Duration::from_secs(60 * i).min(total);
        std::thread::sleep(until.saturating_duration_since(Instant::now()));
        let mut m = std::mem::take(&mut *minute.lock().expect("the minute"));
        m.latencies.sort_by(f64::total_cmp);
        let rss = |s: &Sluice| resident_bytes(s.pid()) as f64 / (1 << 20) as f64;
        println!(
            "| {i} | {fault} | {} | {:.2} | {:.2} | {} / {} / {} / {} | {} | {:.1} / {:.1} | {} / {} |",
            m.latencies.len(),
            percentile(&m.latencies, 50),
            percentile(&m.latencies, 99),
            m.exact,
            m.under,
            m.over,
            m.errors,
            m.most,
            rss(&servers[0]),
            rss(&servers[1]),
            open_fds(servers[0].pid()),
            open_fds(servers[1].pid()),
        );
        let _ = std::io::stdout().flush();
    }
    stop.store(true, Ordering::SeqCst);
    let _ = load.join();
    let _ = std::fs::remove_dir_all(&dir);
}
