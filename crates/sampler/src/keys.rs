//! [`KeyStream`]: explicit random keys, one per draw, from a seed.

use mlx_tensor::{Array, random};

use crate::{Options, Result};

/// A reproducible sequence of MLX random keys.
///
/// Draw `n` uses `random::key(splitmix64(seed, n))`: a counter-based stream
/// rather than a chain of `split` calls, so taking a key does no device work
/// and no lazy graph grows from one step to the next. Equal seeds give equal
/// streams; different seeds give unrelated ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyStream {
    seed: u64,
    /// Keys handed out so far.
    counter: u64,
}

impl KeyStream {
    /// A stream from an explicit seed.
    pub fn new(seed: u64) -> Self {
        KeyStream { seed, counter: 0 }
    }

    /// A stream from `opts.seed`, or from `fallback` when the request has no
    /// seed (the caller decides where unseeded randomness comes from).
    pub fn from_options(opts: &Options, fallback: u64) -> Self {
        KeyStream::new(opts.seed.unwrap_or(fallback))
    }

    /// The next key (`uint32[2]`).
    pub fn next_key(&mut self) -> Result<Array> {
        let mixed = splitmix64(self.seed ^ splitmix64(self.counter));
        self.counter += 1;
        Ok(random::key(mixed)?)
    }

    /// The seed the stream started from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// How many keys have been taken.
    pub fn draws(&self) -> u64 {
        self.counter
    }
}

/// The splitmix64 finaliser: a bijective 64-bit mix with full avalanche.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_seeds_give_equal_keys_and_draws_differ() -> Result<()> {
        let mut a = KeyStream::new(7);
        let mut b = KeyStream::new(7);
        let mut c = KeyStream::new(8);
        let a0 = a.next_key()?.to_vec::<u32>()?;
        let a1 = a.next_key()?.to_vec::<u32>()?;
        assert_eq!(a0, b.next_key()?.to_vec::<u32>()?);
        assert_ne!(a0, a1, "consecutive keys of one stream");
        assert_ne!(a0, c.next_key()?.to_vec::<u32>()?, "seeds 7 and 8");
        assert_eq!(a.draws(), 2);
        Ok(())
    }

    #[test]
    fn options_seed_wins_over_the_fallback() {
        let seeded = Options {
            seed: Some(3),
            ..Options::default()
        };
        assert_eq!(KeyStream::from_options(&seeded, 99).seed(), 3);
        assert_eq!(KeyStream::from_options(&Options::default(), 99).seed(), 99);
    }
}
