//! Auto's rounds priced at the fixed depths' costs: the one copy of the
//! arithmetic behind the `priced` figure of a `spec-scale` run. scale-bench
//! computes it per run and per resample of its request blocks; the report
//! (`xtask/src/report/scale.rs`, which includes this file by `#[path]` and
//! runs its tests) recomputes it for rows written before scale-bench did.

/// The seconds that `rounds[d]` rounds at each depth `d` would have taken at
/// `at`'s seconds a round (`(depth, seconds)` sorted by depth; plain's are
/// seconds a token). A drafting depth without a fixed case is priced on the
/// line through the two deepest drafting cases: plain is no point of that
/// line (a pipelined token waits for no verify), and a line through it
/// would price the deep rounds of a run without deep cases far too cheap.
/// `None` where that line is needed and `at` has fewer than two drafting
/// depths, or where plain ran without a plain case.
pub(crate) fn priced_seconds(at: &[(usize, f64)], rounds: &[f64]) -> Option<f64> {
    let drafting: Vec<(usize, f64)> = at.iter().copied().filter(|x| x.0 > 0).collect();
    let mut sum = 0.0;
    for (d, &n) in rounds.iter().enumerate().filter(|x| *x.1 > 0.0) {
        let s = match at.iter().find(|x| x.0 == d) {
            Some(x) => x.1,
            None => {
                let ([.., a, b], true) = (drafting.as_slice(), d > 0) else {
                    return None;
                };
                b.1 + (d as f64 - b.0 as f64) * (b.1 - a.1) / (b.0 - a.0) as f64
            }
        };
        sum += n * s;
    }
    Some(sum)
}

#[cfg(test)]
mod tests {
    use super::priced_seconds;

    #[test]
    fn measured_depths_are_priced_at_their_own_cost() {
        let at = [(0, 1.0), (1, 2.0), (2, 2.5)];
        // 4 plain tokens, 2 rounds at depth 1, 2 at depth 2: 4 + 4 + 5.
        assert_eq!(priced_seconds(&at, &[4.0, 2.0, 2.0]), Some(13.0));
    }

    #[test]
    fn a_depth_without_a_case_is_on_the_line_through_the_two_deepest() {
        // Depths 2 and 4 at 3 and 4 s: depth 3 at 3.5, depth 6 at 5.
        let at = [(0, 1.0), (2, 3.0), (4, 4.0)];
        let got = priced_seconds(&at, &[0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 1.0]).unwrap();
        assert!((got - 12.0).abs() < 1e-12, "{got}");
    }

    #[test]
    fn a_line_needs_two_drafting_depths() {
        assert_eq!(priced_seconds(&[(2, 3.0)], &[0.0, 1.0]), None);
        // Unused depths need no line.
        assert_eq!(priced_seconds(&[(2, 3.0)], &[0.0, 0.0, 2.0]), Some(6.0));
        // Plain is no point of the drafting line: plain and depth 4 alone
        // do not price depth 5.
        let at = [(0, 0.5), (4, 2.0)];
        assert_eq!(priced_seconds(&at, &[0.0, 0.0, 0.0, 0.0, 1.0, 1.0]), None);
        assert_eq!(priced_seconds(&at, &[2.0, 0.0, 0.0, 0.0, 1.0]), Some(3.0));
        // Plain rounds without a plain case are not priced on the line.
        assert_eq!(priced_seconds(&[(1, 1.0), (2, 2.0)], &[1.0, 1.0]), None);
    }
}
