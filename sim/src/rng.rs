//! Seeded randomness: one generator per simulation, so that a run is a
//! function of its seed, and the distributions the scenarios draw from.

/// xoshiro256++ (Blackman and Vigna), seeded through SplitMix64.
#[derive(Debug, Clone)]
pub struct Rng {
    state: [u64; 4],
}

impl Rng {
    /// A generator whose every draw follows from `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        let mut mix = seed;
        let mut next = || {
            mix = mix.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = mix;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Self {
            state: [next(), next(), next(), next()],
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let [a, b, c, d] = &mut self.state;
        let result = a.wrapping_add(*d).rotate_left(23).wrapping_add(*a);
        let t = *b << 17;
        *c ^= *a;
        *d ^= *b;
        *b ^= *c;
        *a ^= *d;
        *c ^= t;
        *d = d.rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)`, 53 bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1_u64 << 53) as f64
    }

    /// Uniform in `0..n` (`n > 0`), by Lemire's multiply-shift (its bias,
    /// below 2^-32 for the counts drawn here, is left in).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Exponential of mean `mean`: the gap between events of a Poisson
    /// process.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }

    /// Standard normal, by Box and Muller (one of the pair).
    pub fn normal(&mut self) -> f64 {
        let radius = (-2.0 * (1.0 - self.unit()).ln()).sqrt();
        radius * (std::f64::consts::TAU * self.unit()).cos()
    }

    /// Log-normal of median `median` and shape `sigma`.
    pub fn log_normal(&mut self, median: f64, sigma: f64) -> f64 {
        median * (sigma * self.normal()).exp()
    }
}

/// Zipf's law over ranks `1..=n` with exponent `s`: rank `k` drawn with
/// weight `k^-s`, in constant time by rejection-inversion (Hörmann and
/// Derflinger, "Rejection-inversion to generate variates from monotone
/// discrete distributions", 1996).
#[derive(Debug, Clone)]
pub struct Zipf {
    n: f64,
    exponent: f64,
    integral_first: f64,
    integral_last: f64,
    squeeze: f64,
}

impl Zipf {
    /// Ranks `1..=n` (`n ≥ 1`) with exponent `exponent > 0`.
    #[must_use]
    pub fn new(n: u64, exponent: f64) -> Self {
        let mut zipf = Self {
            n: n as f64,
            exponent,
            integral_first: 0.0,
            integral_last: 0.0,
            squeeze: 0.0,
        };
        zipf.integral_first = zipf.integral(1.5) - 1.0;
        zipf.integral_last = zipf.integral(zipf.n + 0.5);
        zipf.squeeze = 2.0 - zipf.integral_inverse(zipf.integral(2.5) - zipf.weight(2.0));
        zipf
    }

    /// A rank in `1..=n`.
    pub fn sample(&mut self, rng: &mut Rng) -> u64 {
        loop {
            let u = self.integral_last + rng.unit() * (self.integral_first - self.integral_last);
            let x = self.integral_inverse(u);
            let k = (x + 0.5).floor().clamp(1.0, self.n);
            if k - x <= self.squeeze || u >= self.integral(k + 0.5) - self.weight(k) {
                return k as u64;
            }
        }
    }

    /// `x^-s`.
    fn weight(&self, x: f64) -> f64 {
        (-self.exponent * x.ln()).exp()
    }

    /// An antiderivative of the weight: `(x^(1-s) - 1) / (1 - s)`, and
    /// `ln x` at `s = 1`, written to stay exact near it.
    fn integral(&self, x: f64) -> f64 {
        let log = x.ln();
        expm1_over((1.0 - self.exponent) * log) * log
    }

    /// The integral's inverse.
    fn integral_inverse(&self, y: f64) -> f64 {
        let t = (y * (1.0 - self.exponent)).max(-1.0);
        (log1p_over(t) * y).exp()
    }
}

/// `(e^x - 1) / x`, 1 at 0.
fn expm1_over(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x / 2.0
    }
}

/// `ln(1 + x) / x`, 1 at 0.
fn log1p_over(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::{Rng, Zipf};

    #[test]
    fn one_seed_one_sequence() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let mut c = Rng::new(8);
        let first: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        assert_eq!(first, (0..4).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_ne!(first, (0..4).map(|_| c.next_u64()).collect::<Vec<_>>());
    }

    #[test]
    fn zipf_ranks_fall_with_their_weight() {
        // s = 1 over 1 000 ranks: rank 1 has 1/H(1000) = 13.4 % of draws,
        // rank 2 half that, rank 10 a tenth.
        let mut rng = Rng::new(1);
        let mut zipf = Zipf::new(1_000, 1.0);
        let mut counts = vec![0_u32; 1_001];
        let draws = 400_000;
        for _ in 0..draws {
            counts[zipf.sample(&mut rng) as usize] += 1;
        }
        let share = |rank: usize| f64::from(counts[rank]) / f64::from(draws);
        assert!((share(1) - 0.1336).abs() < 0.003, "{}", share(1));
        assert!((share(2) - 0.0668).abs() < 0.003, "{}", share(2));
        assert!((share(10) - 0.0134).abs() < 0.001, "{}", share(10));
        assert_eq!(counts[0], 0);
    }

    #[test]
    fn exponential_gaps_have_their_mean() {
        let mut rng = Rng::new(3);
        let mean = (0..200_000).map(|_| rng.exponential(2.0)).sum::<f64>() / 200_000.0;
        assert!((mean - 2.0).abs() < 0.02, "{mean}");
    }
}
