//! A memory budget for untrusted work on the Rust heap: a counting global
//! allocator and [`run_bounded`], which runs a closure on its own thread and
//! stops it when its allocations pass a limit.
//!
//! Rust's allocator interface cannot fail an allocation gracefully (a null
//! return aborts the process), so the budget is enforced by parking: when the
//! bounded thread asks for memory beyond its limit the allocator does not
//! allocate and puts that thread to sleep for good, and [`run_bounded`]
//! returns [`OverBudget`] to its caller. The parked thread keeps at most the
//! limit, until the process exits. This is for work that owns nothing the
//! rest of the program needs (rendering a model's chat template, a string
//! that doubles in a loop); it must not hold locks that others take.
//!
//! The counting only happens when the binary installs [`Counting`] as its
//! global allocator; without it [`run_bounded`] runs the closure unbounded
//! ([`installed`] says which). MLX's own buffers are allocated by C++ and are
//! not counted.
//!
//! ```
//! // (A binary would declare `#[global_allocator] static A: Counting = Counting;`.)
//! let v = mlx_tensor::budget::run_bounded(1 << 20, || vec![0u8; 10].len());
//! assert_eq!(v.unwrap(), 10);
//! ```
// The one module besides the MLX bridge with `unsafe`: a `GlobalAlloc` impl
// cannot be written without it.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::time::Duration;

/// The system allocator, counting the bytes of threads inside [`run_bounded`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Counting;

/// One bounded run's account.
#[derive(Debug)]
struct Account {
    /// Bytes allocated minus bytes freed by the bounded thread.
    used: AtomicIsize,
    /// The limit in bytes.
    limit: AtomicIsize,
    /// Set when an allocation was refused.
    exceeded: AtomicBool,
    /// Whether a run holds this account.
    busy: AtomicBool,
}

impl Account {
    const fn new() -> Account {
        Account {
            used: AtomicIsize::new(0),
            limit: AtomicIsize::new(0),
            exceeded: AtomicBool::new(false),
            busy: AtomicBool::new(false),
        }
    }
}

/// Accounts reused by successive runs; one held by a parked thread stays taken.
static ACCOUNTS: [Account; 32] = [const { Account::new() }; 32];
/// Set by the first allocation through [`Counting`].
static INSTALLED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The account of the bounded run on this thread, if any. A const
    /// initialiser without a destructor: reading it never allocates.
    static ACCOUNT: Cell<Option<&'static Account>> = const { Cell::new(None) };
}

/// Charges `bytes` to this thread's account; parks the thread for good when
/// that would pass the limit (the allocation is then never made).
fn charge(bytes: usize) {
    // A load first: a store on every allocation would bounce the cache line
    // between the threads that allocate.
    if !INSTALLED.load(Ordering::Relaxed) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
    let Ok(Some(account)) = ACCOUNT.try_with(Cell::get) else {
        return;
    };
    let bytes = bytes.min(isize::MAX as usize) as isize;
    let used = account.used.fetch_add(bytes, Ordering::Relaxed);
    if used.saturating_add(bytes) > account.limit.load(Ordering::Relaxed) {
        account.exceeded.store(true, Ordering::SeqCst);
        loop {
            // `sleep` makes a system call and never allocates (unlike `park`,
            // which may build the thread handle).
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}

fn refund(bytes: usize) {
    if let Ok(Some(account)) = ACCOUNT.try_with(Cell::get) {
        let bytes = bytes.min(isize::MAX as usize) as isize;
        account.used.fetch_sub(bytes, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees hold; the counting around the calls
// touches only atomics and a const thread-local, never allocating itself.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        charge(layout.size());
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract for `layout`.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        charge(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        refund(layout.size());
        // SAFETY: `ptr` was allocated by `System` (through this type) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            charge(new_size - layout.size());
        } else {
            refund(layout.size() - new_size);
        }
        // SAFETY: `ptr` was allocated by `System` with `layout`; the caller
        // upholds `realloc`'s contract for `new_size`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Whether [`Counting`] is this process's global allocator (known once it
/// has served an allocation, which happens before `main`).
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

/// The bounded thread asked for more than its limit and was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the work needed more than {limit} bytes of memory and was stopped")]
pub struct OverBudget {
    /// The limit in bytes.
    pub limit: usize,
}

/// Runs `f` on a new thread whose heap allocations may not pass `limit`
/// bytes (net of what it frees); returns its value, or [`OverBudget`] when it
/// was stopped. Without [`Counting`] installed, `f` runs unbounded.
///
/// A panic in `f` is resumed on the calling thread.
pub fn run_bounded<T, F>(limit: usize, f: F) -> Result<T, OverBudget>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    if !installed() {
        return Ok(f());
    }
    let account = take_account(limit);
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::Builder::new()
        .name("bounded".into())
        .spawn(move || {
            ACCOUNT.with(|a| a.set(Some(account)));
            let value = f();
            ACCOUNT.with(|a| a.set(None));
            let _ = tx.send(value);
        })
        .expect("spawning a thread");
    loop {
        match rx.recv_timeout(Duration::from_millis(2)) {
            Ok(value) => {
                let _ = handle.join();
                account.busy.store(false, Ordering::SeqCst);
                return Ok(value);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if account.exceeded.load(Ordering::SeqCst) {
                    // The thread sleeps for good and keeps its account.
                    return Err(OverBudget { limit });
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                account.busy.store(false, Ordering::SeqCst);
                match handle.join() {
                    Err(panic) => std::panic::resume_unwind(panic),
                    Ok(()) => unreachable!("the bounded thread sends before it ends"),
                }
            }
        }
    }
}

/// A free account set to `limit`, or a new leaked one when all are held.
fn take_account(limit: usize) -> &'static Account {
    let account = ACCOUNTS
        .iter()
        .find(|a| {
            a.busy
                .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        })
        .unwrap_or_else(|| {
            let a: &'static Account = Box::leak(Box::new(Account::new()));
            a.busy.store(true, Ordering::SeqCst);
            a
        });
    account.used.store(0, Ordering::SeqCst);
    account
        .limit
        .store(limit.min(isize::MAX as usize) as isize, Ordering::SeqCst);
    account.exceeded.store(false, Ordering::SeqCst);
    account
}
