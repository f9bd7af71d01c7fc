//! The LB policies' timers, kept off the runtime's timer wheel: one thread
//! for the process, as C-core keeps its timers on a timer manager's
//! threads.
//!
//! Why: while any timer is pending in a tokio runtime, each time a worker
//! parks it reads the clock and walks the wheel for the next expiry. A
//! channel's policies keep timers pending for their whole life (C-core's
//! idle sweep of `xds_override_host`, outlier detection's interval,
//! weighted round robin's weight updates), and a client making calls one
//! after another parks a few times per call: 600 to 1,300 instructions a
//! call under callgrind, more than everything the session filter does. LB
//! timers are seconds long and need no better than a millisecond, so a
//! thread that sleeps until the next one and sends [`Event::Timer`] into
//! the LB task's queue serves them all.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Instant;

use tokio::sync::mpsc;

use super::{Event, TimerToken};

/// Where a due timer's event goes.
struct Pending {
    events: mpsc::UnboundedSender<Event>,
    token: TimerToken,
}

#[derive(Default)]
struct State {
    /// Deadlines by id; cancelled ids stay until they come up, or until
    /// they outnumber the pending ones (then the heap is remade).
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    pending: HashMap<u64, Pending>,
    next_id: u64,
    started: bool,
}

#[derive(Default)]
struct Timers {
    state: Mutex<State>,
    changed: Condvar,
}

fn timers() -> &'static Timers {
    static TIMERS: OnceLock<Timers> = OnceLock::new();
    TIMERS.get_or_init(Timers::default)
}

impl Timers {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics under the lock: a poisoned state is consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The thread's loop: sends what is due, then sleeps until the next
    /// deadline or a change.
    fn run(&self) {
        let mut state = self.lock();
        loop {
            let now = Instant::now();
            let mut due = Vec::new();
            while let Some(&Reverse((at, id))) = state.heap.peek() {
                if at > now {
                    break;
                }
                state.heap.pop();
                if let Some(p) = state.pending.remove(&id) {
                    due.push(p);
                }
            }
            if !due.is_empty() {
                drop(state);
                for p in due {
                    // A closed queue: the channel is gone, nothing to tell.
                    let _ = p.events.send(Event::Timer(p.token));
                }
                state = self.lock();
                continue;
            }
            state = match state.heap.peek() {
                Some(&Reverse((at, _))) => {
                    self.changed
                        .wait_timeout(state, at.saturating_duration_since(now))
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                None => self
                    .changed
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner),
            };
        }
    }
}

/// Sends [`Event::Timer`]`(token)` into `events` at `at`; the id cancels it.
pub(crate) fn schedule(
    at: Instant,
    events: mpsc::UnboundedSender<Event>,
    token: TimerToken,
) -> u64 {
    let shared = timers();
    let mut state = shared.lock();
    if !state.started {
        let spawned = std::thread::Builder::new()
            .name("tether-lb-timers".into())
            .spawn(|| timers().run());
        match spawned {
            Ok(_) => state.started = true,
            Err(e) => log::error!("LB timers: cannot start their thread: {e}"),
        }
    }
    state.next_id += 1;
    let id = state.next_id;
    let earliest = state
        .heap
        .peek()
        .is_none_or(|Reverse((first, _))| at < *first);
    state.heap.push(Reverse((at, id)));
    state.pending.insert(id, Pending { events, token });
    drop(state);
    if earliest {
        shared.changed.notify_one();
    }
    id
}

/// Cancels timer `id` (nothing if it fired already).
pub(crate) fn cancel(id: u64) {
    let mut state = timers().lock();
    if state.pending.remove(&id).is_some() && state.heap.len() > 2 * state.pending.len() + 64 {
        // Timers re-armed often (a sweep on every update) would otherwise
        // leave their cancelled deadlines behind for hours.
        let State { heap, pending, .. } = &mut *state;
        heap.retain(|Reverse((_, id))| pending.contains_key(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn timers_fire_in_deadline_order_and_cancelled_ones_never() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let now = Instant::now();
        schedule(now + Duration::from_millis(60), tx.clone(), TimerToken(3));
        let cancelled = schedule(now + Duration::from_millis(20), tx.clone(), TimerToken(1));
        schedule(now + Duration::from_millis(40), tx.clone(), TimerToken(2));
        cancel(cancelled);
        let mut fired = Vec::new();
        for _ in 0..2 {
            match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
                Ok(Some(Event::Timer(t))) => fired.push((t, Instant::now())),
                other => panic!("no timer event: {other:?}"),
            }
        }
        assert_eq!(fired[0].0, TimerToken(2));
        assert_eq!(fired[1].0, TimerToken(3));
        assert!(fired[0].1 >= now + Duration::from_millis(40));
        assert!(fired[1].1 >= now + Duration::from_millis(60));
        assert!(
            tokio::time::timeout(Duration::from_millis(100), rx.recv())
                .await
                .is_err(),
            "the cancelled timer fired"
        );
    }

    #[test]
    fn many_cancelled_timers_do_not_pile_up() {
        let (tx, _rx) = mpsc::unbounded_channel();
        let far = Instant::now() + Duration::from_secs(3600);
        for i in 0..1_000 {
            cancel(schedule(far, tx.clone(), TimerToken(i)));
        }
        let state = timers().lock();
        assert!(
            state.heap.len() <= 2 * state.pending.len() + 65,
            "{}",
            state.heap.len()
        );
    }
}
