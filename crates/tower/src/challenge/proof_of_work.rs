//! The built-in challenge: proof of work.
//!
//! The 429 carries a nonce and a difficulty `d`. The client finds a decimal counter `c` such
//! that SHA-256(nonce ‖ c) (the ASCII text of both, concatenated) starts with `d` zero bits,
//! and retries with `Sluice-Pow: nonce:c`. Nonces are stateless: an HMAC binds the expiry,
//! the difficulty and the client's key to them, so they cannot be forged, made easier, or
//! used by another client. A bounded set of spent nonces refuses replays. Each difficulty
//! bit doubles the expected work; the difficulty grows by one bit each time the client's
//! solved requests in the ceiling window double.

use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use http::request::Parts;
use http::{HeaderName, HeaderValue};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use sluice_limiter::{Clock, SystemClock};

use super::nonces::{SpendError, SpentNonces};
use super::{Challenge, Offer, Subject, Verification, VerifyFuture};

/// The header a client answers in: `Sluice-Pow: NONCE:COUNTER`.
pub static SOLUTION_HEADER: HeaderName = HeaderName::from_static("sluice-pow");
/// The header a challenge is offered in: `Sluice-Challenge: pow; nonce="..."; difficulty=16`.
pub static CHALLENGE_HEADER: HeaderName = HeaderName::from_static("sluice-challenge");

const VERSION: u8 = 1;
/// version, expiry (u64 seconds), difficulty, 12 random bytes.
const PAYLOAD: usize = 1 + 8 + 1 + 12;
const TAG: usize = 16;
/// Longest counter accepted: any u64 in decimal.
const MAX_COUNTER_DIGITS: usize = 20;

type HmacSha256 = Hmac<Sha256>;

/// Proof-of-work challenges. One instance per process is enough; give every process behind
/// one load balancer the same [`ProofOfWork::with_secret`] so any of them can verify.
pub struct ProofOfWork {
    secret: [u8; 32],
    base: u8,
    max: u8,
    ttl: Duration,
    clock: Arc<dyn Clock>,
    spent: SpentNonces,
}

impl std::fmt::Debug for ProofOfWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProofOfWork")
            .field("base", &self.base)
            .field("max", &self.max)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Default for ProofOfWork {
    fn default() -> Self {
        ProofOfWork::new()
    }
}

impl ProofOfWork {
    /// A random secret, difficulty 16 bits growing to at most 24, nonces valid 5 minutes,
    /// at most 100,000 spent nonces remembered.
    ///
    /// # Panics
    /// If the operating system has no source of randomness.
    pub fn new() -> ProofOfWork {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).expect("the operating system's random source");
        ProofOfWork::with_secret(secret)
    }

    pub fn with_secret(secret: [u8; 32]) -> ProofOfWork {
        ProofOfWork {
            secret,
            base: 16,
            max: 24,
            ttl: Duration::from_secs(300),
            clock: Arc::new(SystemClock::new()),
            spent: SpentNonces::new(100_000),
        }
    }

    /// Leading zero bits asked of a first offender, and the most ever asked (both at most
    /// 64; `max` at least `base`).
    pub fn difficulty(mut self, base: u8, max: u8) -> Self {
        self.base = base.min(64);
        self.max = max.clamp(self.base, 64);
        self
    }

    /// How long an offered nonce may be answered.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The clock nonces expire by (tests use a manual one).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Bound on spent nonces remembered. When full of unexpired ones, new answers are
    /// refused until some expire.
    pub fn max_spent(mut self, max: usize) -> Self {
        self.spent = SpentNonces::new(max);
        self
    }

    /// The difficulty for a client at `level`: one more bit each time its solved requests
    /// double.
    pub fn difficulty_for(&self, level: u64) -> u8 {
        let extra = (level + 1).ilog2().min(64) as u8;
        self.base.saturating_add(extra).min(self.max)
    }

    fn now_secs(&self) -> u64 {
        self.clock.now() / 1_000_000_000
    }

    fn mac(&self, payload: &[u8], digest: &[u8; 32]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.secret).expect("HMAC takes any key");
        mac.update(payload);
        mac.update(digest);
        mac
    }

    /// A fresh nonce for `subject` at `difficulty` bits.
    pub fn nonce(&self, subject: &Subject<'_>, difficulty: u8) -> String {
        let expires = self.now_secs().saturating_add(self.ttl.as_secs().max(1));
        let mut bytes = Vec::with_capacity(PAYLOAD + TAG);
        bytes.push(VERSION);
        bytes.extend_from_slice(&expires.to_be_bytes());
        bytes.push(difficulty);
        let mut random = [0u8; 12];
        getrandom::fill(&mut random).expect("the operating system's random source");
        bytes.extend_from_slice(&random);
        let tag = self.mac(&bytes, subject.digest).finalize().into_bytes();
        bytes.extend_from_slice(&tag[..TAG]);
        crate::base64::encode_url(&bytes)
    }

    /// Judges `answer` (`NONCE:COUNTER`) for `subject`, spending the nonce if it is right.
    pub fn check(&self, answer: &str, subject: &Subject<'_>) -> Verification {
        let refuse = |why: &str| Verification::Refused(why.to_owned());
        let Some((nonce, counter)) = answer.trim().rsplit_once(':') else {
            return refuse("malformed answer: expected NONCE:COUNTER");
        };
        if counter.is_empty()
            || counter.len() > MAX_COUNTER_DIGITS
            || !counter.bytes().all(|b| b.is_ascii_digit())
        {
            return refuse("malformed answer: the counter must be decimal digits");
        }
        let bytes = match crate::base64::decode_url(nonce) {
            Some(b) if b.len() == PAYLOAD + TAG && b[0] == VERSION => b,
            _ => return refuse("malformed nonce"),
        };
        let (payload, tag) = bytes.split_at(PAYLOAD);
        if self
            .mac(payload, subject.digest)
            .verify_truncated_left(tag)
            .is_err()
        {
            return refuse("this nonce was not issued to this client");
        }
        let expires = u64::from_be_bytes(payload[1..9].try_into().expect("8 bytes"));
        let now = self.now_secs();
        if now >= expires {
            return refuse("expired nonce");
        }
        let difficulty = payload[9];
        let hash = Sha256::new()
            .chain_update(nonce.as_bytes())
            .chain_update(counter.as_bytes())
            .finalize();
        if leading_zero_bits(&hash) < u32::from(difficulty) {
            return refuse("wrong solution");
        }
        let id = tag.try_into().expect("TAG bytes");
        match self.spent.spend(id, expires, now) {
            Ok(()) => Verification::Solved,
            Err(SpendError::AlreadySpent) => refuse("this nonce was already used"),
            Err(SpendError::Full) => refuse("too many recent solutions; wait for a new nonce"),
        }
    }
}

impl Challenge for ProofOfWork {
    fn answer<'r>(&self, request: &'r Parts) -> Option<&'r str> {
        request.headers.get(&SOLUTION_HEADER)?.to_str().ok()
    }

    fn verify<'a>(&'a self, answer: &'a str, subject: Subject<'a>) -> VerifyFuture<'a> {
        let verdict = self.check(answer, &subject);
        Box::pin(std::future::ready(verdict))
    }

    fn offer(&self, subject: Subject<'_>) -> Offer {
        let difficulty = self.difficulty_for(subject.level);
        let nonce = self.nonce(&subject, difficulty);
        let header = format!("pow; nonce=\"{nonce}\"; difficulty={difficulty}");
        let mut fields = Map::new();
        fields.insert("type".into(), "proof-of-work".into());
        fields.insert("algorithm".into(), "sha256".into());
        fields.insert("nonce".into(), Value::String(nonce));
        fields.insert("difficulty".into(), difficulty.into());
        fields.insert("expires_in".into(), self.ttl.as_secs().max(1).into());
        fields.insert(
            "answer".into(),
            format!(
                "retry with header `{}: NONCE:COUNTER` where SHA-256(NONCE followed by COUNTER \
                 in decimal) starts with {difficulty} zero bits",
                SOLUTION_HEADER.as_str()
            )
            .into(),
        );
        Offer {
            headers: vec![(
                CHALLENGE_HEADER.clone(),
                HeaderValue::from_str(&header).expect("base64url and digits are ASCII"),
            )],
            fields,
        }
    }
}

/// Leading zero bits of `hash`.
pub fn leading_zero_bits(hash: &[u8]) -> u32 {
    let mut bits = 0;
    for &byte in hash {
        bits += byte.leading_zeros();
        if byte != 0 {
            break;
        }
    }
    bits
}

/// Finds the smallest counter answering `nonce` at `difficulty` (what a client does; about
/// 2^difficulty hashes).
pub fn solve(nonce: &str, difficulty: u8) -> u64 {
    let prefix = Sha256::new().chain_update(nonce.as_bytes());
    let mut buf = itoa_buf();
    (0u64..)
        .find(|counter| {
            let digits = decimal(*counter, &mut buf);
            let hash = prefix.clone().chain_update(digits).finalize();
            leading_zero_bits(&hash) >= u32::from(difficulty)
        })
        .expect("some counter below 2^64 answers any difficulty up to 64 bits, almost surely")
}

fn itoa_buf() -> [u8; MAX_COUNTER_DIGITS] {
    [0; MAX_COUNTER_DIGITS]
}

fn decimal(mut n: u64, buf: &mut [u8; MAX_COUNTER_DIGITS]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}
