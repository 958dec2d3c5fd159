//! What goes over the wire: the script's keys and arguments for each kind
//! of call, the call itself (`EVALSHA`, then `EVAL` when the server lacks
//! the script), and the integers of its replies read back. The script's
//! own header (`lua/limits.lua`) documents the same layout from its side.

use redis::{ErrorKind, FromRedisValue};
use tollgate::Decision;
use tollgate::algorithm::Carry;
use tollgate::remote::{GiveBack, LeaseReply, LeaseRequest, RemoteQuota};

use super::time::Now;
use crate::connection::{CallError, Connection};
use crate::error::Error;
use crate::failure::{Admission, Unavailable};
use crate::script::ScriptLimit;

/// The script's source and SHA-1.
#[derive(Debug)]
pub(super) struct Script {
    pub(super) source: String,
    pub(super) sha: String,
}

/// What a call asks of the script.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Check,
    Peek,
    /// Check one limit, replying with what gives its admission back.
    CheckReceipt,
    /// Reserve (one GCRA limit), waiting at most this many microseconds.
    Reserve(u64),
}

/// One call of the script: its keys and arguments, written straight into
/// the command (the `EVAL` fallback writes them again).
pub(super) struct Call<'a> {
    op: Op,
    limits: &'a [Entry<'a>],
}

/// One limit of a call.
pub(super) struct Entry<'a> {
    pub(super) key: Vec<u8>,
    pub(super) stamp: Stamp,
    pub(super) cost: u32,
    pub(super) now: &'a Now,
    pub(super) grace_ms: u64,
}

/// The quota a call decides by, and what the script stamps values with:
/// the quota's span and burst, its revision, and how a key stamped with an
/// earlier revision is carried over to it (`"a"`, `"p"` or `"u"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stamp {
    pub(super) limit: ScriptLimit,
    pub(super) revision: u32,
    pub(super) carry: &'static str,
}

impl Stamp {
    /// The stamp a value written by this quota holds: "revision span
    /// burst".
    pub(super) fn written(&self) -> String {
        format!(
            "{} {} {}",
            self.revision, self.limit.span_us, self.limit.burst
        )
    }
}

/// The script's name for a strategy ([`Carry`]); `None` for one it does
/// not implement.
pub(super) fn carry_code(carry: Carry) -> Option<&'static str> {
    match carry {
        Carry::AsIs => Some("a"),
        Carry::Proportional => Some("p"),
        Carry::Unchanged => Some("u"),
        _ => None,
    }
}

/// The bytes of a limit's arguments but its key, at most: the time, the
/// algorithm, the cost, the span, the burst, the grace, the revision and
/// the strategy, each at most 20 digits.
const ENTRY_BYTES: usize = 8 * 20;

impl<'a> Call<'a> {
    /// A call deciding `limits` (one for a check), in their order.
    pub(super) fn new(op: Op, limits: &'a [Entry<'a>]) -> Self {
        Self { op, limits }
    }

    /// Writes `EVALSHA` or `EVAL` (`name`) of `body`, with the keys and
    /// arguments, into a command sized for them at once.
    fn command(&self, name: &str, body: &str) -> redis::Cmd {
        let keys: usize = self.limits.iter().map(|limit| limit.key.len()).sum();
        let mut command = redis::Cmd::with_capacity(
            4 + 9 * self.limits.len(),
            name.len() + body.len() + 64 + keys + ENTRY_BYTES * self.limits.len(),
        );
        command.arg(name).arg(body).arg(self.limits.len());
        for limit in self.limits {
            command.arg(&limit.key);
        }
        command.arg(match self.op {
            Op::Check => "0",
            Op::Peek => "1",
            Op::CheckReceipt => "5",
            Op::Reserve(_) => "2",
        });
        for Entry {
            stamp,
            cost,
            now,
            grace_ms,
            ..
        } in self.limits
        {
            time_argument(&mut command, now);
            command
                .arg(stamp.limit.code)
                .arg(cost)
                .arg(stamp.limit.span_us)
                .arg(stamp.limit.burst)
                .arg(grace_ms)
                .arg(stamp.revision)
                .arg(stamp.carry);
        }
        if let Op::Reserve(max_wait_us) = self.op {
            command.arg(max_wait_us);
        }
        command
    }

    /// Runs the call (see [`evaluate`]).
    pub(super) async fn send<T: FromRedisValue>(
        &self,
        connection: &Connection,
        script: &Script,
    ) -> Result<T, CallError> {
        evaluate(connection, script, |name, body| self.command(name, body)).await
    }
}

/// Writes a call's time: microseconds, or `""` for the server's `TIME`.
fn time_argument(command: &mut redis::Cmd, now: &Now) {
    match now.us {
        Some(us) => command.arg(us),
        None => command.arg(""),
    };
}

/// Writes the arguments of a lease call after the key: mode "4", now,
/// interval, burst, cost, units wanted, the TAT and units given back, the
/// grace, the revision and the strategy.
pub(super) fn lease_arguments(
    command: &mut redis::Cmd,
    now: &Now,
    quota: &RemoteQuota,
    request: &LeaseRequest,
    grace_ms: u64,
    stamp: &Stamp,
) {
    command.arg("4");
    time_argument(command, now);
    command
        .arg(quota.interval_us())
        .arg(quota.burst())
        .arg(request.cost)
        .arg(request.want);
    match request.give_back {
        Some(GiveBack { end_us, units, .. }) => command.arg(end_us).arg(units),
        None => command.arg("").arg(0),
    };
    command.arg(grace_ms).arg(stamp.revision).arg(stamp.carry);
}

/// Writes the arguments of a give-back after the key: mode "6", whether the
/// key is a sliding log's list, what the admission wrote and what it
/// replaced.
pub(super) fn give_back_arguments(
    command: &mut redis::Cmd,
    list: bool,
    written: &[u8],
    previous: &[u8],
) {
    command
        .arg("6")
        .arg(if list { "l" } else { "s" })
        .arg(written)
        .arg(previous);
}

/// Writes the arguments of a refund after the key: mode "3", the TAT the
/// reservation wrote, the TAT to restore, now, the tolerance, the stamp
/// written with the TAT.
pub(super) fn refund_arguments(
    command: &mut redis::Cmd,
    written_us: u64,
    restored_us: u64,
    now: &Now,
    tolerance_us: u64,
    stamp: &str,
) {
    command.arg("3").arg(written_us).arg(restored_us);
    time_argument(command, now);
    command.arg(tolerance_us).arg(stamp);
}

/// Runs the script with the command `command(name, body)` builds
/// (`EVALSHA` with the SHA-1, or `EVAL` with the source when the server
/// has not got it, both within one call timeout), unless the connection's
/// breaker is open, and tells the breaker how it went.
pub(super) async fn evaluate<T: FromRedisValue>(
    connection: &Connection,
    script: &Script,
    command: impl Fn(&str, &str) -> redis::Cmd,
) -> Result<T, CallError> {
    let breaker = connection.breaker();
    if let Admission::Skip(open_for) = breaker.admit() {
        return Err(CallError::Unavailable(Unavailable::BreakerOpen(open_for)));
    }
    let result = connection
        .within(async {
            match connection.send(&command("EVALSHA", &script.sha)).await {
                Err(error) if error.kind() == ErrorKind::NoScriptError => {
                    connection.send(&command("EVAL", &script.source)).await
                }
                other => other,
            }
        })
        .await;
    match &result {
        Ok(_) => breaker.succeeded(),
        Err(CallError::Unavailable(_)) => breaker.failed(),
        Err(CallError::Failed(_)) => {}
    }
    result
}

/// The four integers the script replies for each limit: allowed (1 or 0),
/// remaining, and the retry and reset waits in microseconds.
#[derive(Clone, Copy)]
pub(super) struct Counts {
    pub(super) allowed: bool,
    pub(super) remaining: u32,
    pub(super) retry_us: u64,
    pub(super) reset_us: u64,
}

impl Counts {
    /// Reads one limit's four integers; `None` unless there are exactly
    /// four, each in its type's range.
    fn parse(reply: &[i64]) -> Option<Counts> {
        let &[allowed, remaining, retry_us, reset_us] = reply else {
            return None;
        };
        Some(Counts {
            allowed: allowed == 1,
            remaining: u32::try_from(remaining).ok()?,
            retry_us: u64::try_from(retry_us).ok()?,
            reset_us: u64::try_from(reset_us).ok()?,
        })
    }

    /// Returns the decision these counts make for a limit of `limit`
    /// decided at `now`; `None` when they contradict themselves (admitted
    /// with a wait, or denied without one).
    pub(super) fn decision(&self, limit: u32, now: &Now) -> Option<Decision> {
        if self.allowed != (self.retry_us == 0) {
            return None;
        }
        Decision::from_parts(
            limit,
            self.remaining,
            now.after(self.retry_us),
            now.after(self.reset_us),
        )
    }
}

/// A check's reply: its integers, and with a receipt ("5"), what the
/// admission wrote and what it replaced (both empty for a denial).
pub(super) struct Replied {
    pub(super) integers: Vec<i64>,
    pub(super) given: Option<(Vec<u8>, Vec<u8>)>,
}

impl FromRedisValue for Replied {
    fn from_redis_value(value: &redis::Value) -> redis::RedisResult<Self> {
        let redis::Value::Array(items) = value else {
            return Vec::<i64>::from_redis_value(value).map(|integers| Self {
                integers,
                given: None,
            });
        };
        let strings = items
            .iter()
            .rev()
            .take_while(|item| matches!(item, redis::Value::BulkString(_)))
            .count();
        let (integers, given) = items.split_at(items.len() - strings);
        let integers = integers
            .iter()
            .map(i64::from_redis_value)
            .collect::<Result<_, _>>()?;
        let given = match given {
            [] => None,
            [written, previous] => Some((
                Vec::<u8>::from_redis_value(written)?,
                Vec::<u8>::from_redis_value(previous)?,
            ))
            .filter(|(written, _)| !written.is_empty()),
            _ => {
                return Err(redis::RedisError::from((
                    ErrorKind::TypeError,
                    "a receipt is two strings",
                )));
            }
        };
        Ok(Self { integers, given })
    }
}

/// Reads the decision in one limit's four integers of the script's reply.
pub(super) fn decision(reply: &[i64], limit: u32, now: &Now) -> Result<Decision, Error> {
    Counts::parse(reply)
        .and_then(|counts| counts.decision(limit, now))
        .ok_or_else(|| malformed(reply))
}

/// Reads a reservation's reply: the limit's four integers, then the TAT
/// written (0 when denied).
pub(super) fn reserved(reply: &[i64]) -> Result<(Counts, u64), Error> {
    reply
        .split_last()
        .and_then(|(&tat_us, counts)| Some((Counts::parse(counts)?, u64::try_from(tat_us).ok()?)))
        .ok_or_else(|| malformed(reply))
}

/// Reads the eight integers of a lease call's reply.
pub(super) fn lease_reply(reply: &[i64], request: &LeaseRequest) -> Result<LeaseReply, Error> {
    let &[
        allowed,
        remaining,
        retry_us,
        reset_us,
        granted,
        end_us,
        now_us,
        returned,
    ] = reply
    else {
        return Err(malformed(reply));
    };
    let whole = |value: i64| u64::try_from(value).map_err(|_| malformed(reply));
    let small = |value: i64| u32::try_from(value).map_err(|_| malformed(reply));
    let lease = LeaseReply::new(
        match allowed {
            0 => false,
            1 => true,
            _ => return Err(malformed(reply)),
        },
        small(remaining)?,
        whole(retry_us)?,
        whole(reset_us)?,
        small(granted)?,
        whole(end_us)?,
        whole(now_us)?,
        small(returned)?,
    );
    if lease.allowed != (lease.retry_us == 0) || lease.granted > request.want {
        return Err(malformed(reply));
    }
    Ok(lease)
}

/// Returns the error for a reply that is not what the call asked for.
pub(super) fn malformed(reply: &[i64]) -> Error {
    Error::Reply(format!("{reply:?}"))
}
