//! Token sampling: greedy, temperature, top-k, top-p, min-p, seeded; an
//! OpenAI-style logit bias and presence / frequency penalties first.
//!
//! Defaults follow the reference engine: temperature 1, top_p 1,
//! min_p 0.05, top_k off; temperature 0 means greedy (argmax).
//! top-p and min-p are both measured on the untempered distribution, so
//! the order in which they are applied does not matter; temperature
//! reshapes only the survivors, as llama.cpp's default chain does.
//! Bias and penalties change the logits before all of that, greedy
//! included (OpenAI's formula: a token sampled `c` times so far loses
//! `c * frequency + (c > 0) * presence`).

use std::collections::HashMap;

use ds4_kernels::cpu::sampling::{argmax, top_k};
use rand::{rngs::StdRng, Rng, SeedableRng};

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    /// Fixed seed for reproducible sampling; `None` draws one.
    pub seed: Option<u64>,
    /// Subtracted from the logit of every token sampled before.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was sampled.
    pub frequency_penalty: f32,
    /// Added to these tokens' logits (ids within the vocabulary).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.05,
            seed: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }

    /// Whether the logits are changed before sampling.
    fn adjusts(&self) -> bool {
        self.presence_penalty != 0.0 || self.frequency_penalty != 0.0 || !self.logit_bias.is_empty()
    }

    /// Reject values no sampler can honour, with a message for the client.
    pub fn validate(&self) -> Result<(), String> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(format!(
                "temperature must be a finite number >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        Ok(())
    }
}

pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// Times each token was sampled (kept only under penalties).
    counts: HashMap<u32, u32>,
    /// The adjusted logits (reused).
    scratch: Vec<f32>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let rng = match params.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        Sampler {
            params,
            rng,
            counts: HashMap::new(),
            scratch: Vec::new(),
        }
    }

    /// Pick the next token from one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if !self.params.adjusts() {
            return self.pick(logits);
        }
        let mut adj = std::mem::take(&mut self.scratch);
        adj.clear();
        adj.extend_from_slice(logits);
        let p = &self.params;
        for &(id, b) in &p.logit_bias {
            if let Some(l) = adj.get_mut(id as usize) {
                *l += b;
            }
        }
        for (&id, &c) in &self.counts {
            if let Some(l) = adj.get_mut(id as usize) {
                *l -= c as f32 * p.frequency_penalty + p.presence_penalty;
            }
        }
        let counted = p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
        let token = self.pick(&adj);
        self.scratch = adj;
        if counted {
            *self.counts.entry(token).or_default() += 1;
        }
        token
    }

    /// Sample from logits as they are.
    fn pick(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        if p.is_greedy() {
            return argmax(logits).unwrap_or(0) as u32;
        }
        let max = logits
            .iter()
            .copied()
            .filter(|v| !v.is_nan())
            .fold(f32::NEG_INFINITY, f32::max);
        // log-sum-exp of the untempered distribution.
        let lse = max
            + logits
                .iter()
                .map(|&l| f64::from(l - max).exp())
                .sum::<f64>()
                .ln() as f32;
        // min-p: p_i >= min_p * p_max  <=>  l_i >= max + ln(min_p).
        let floor = if p.min_p > 0.0 {
            max + p.min_p.ln()
        } else {
            f32::NEG_INFINITY
        };
        let k = if p.top_k == 0 { logits.len() } else { p.top_k };
        let kept: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, &l)| l >= floor)
            .map(|(i, &l)| (i as u32, l))
            .collect();
        let mut cand = if kept.len() > k {
            let mut dense = vec![f32::NEG_INFINITY; logits.len()];
            for &(i, l) in &kept {
                dense[i as usize] = l;
            }
            top_k(&dense, k)
        } else {
            let mut kept = kept;
            kept.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            kept
        };
        if p.top_p < 1.0 {
            let mut cum = 0.0f32;
            let mut keep = cand.len();
            for (n, &(_, l)) in cand.iter().enumerate() {
                cum += (l - lse).exp();
                if cum >= p.top_p {
                    keep = n + 1;
                    break;
                }
            }
            cand.truncate(keep.max(1));
        }
        let t = p.temperature;
        let weights: Vec<f64> = cand
            .iter()
            .map(|&(_, l)| f64::from((l - max) / t).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut r = self.rng.random::<f64>() * total;
        for (&(id, _), w) in cand.iter().zip(&weights) {
            r -= w;
            if r <= 0.0 {
                return id;
            }
        }
        cand.last().map_or(0, |&(id, _)| id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_many(params: SamplingParams, logits: &[f32], n: usize) -> Vec<usize> {
        let mut s = Sampler::new(params);
        let mut counts = vec![0; logits.len()];
        for _ in 0..n {
            counts[s.sample(logits) as usize] += 1;
        }
        counts
    }

    #[test]
    fn bias_and_penalties_move_the_choice() {
        let logits = [0.0, 3.0, 2.9, -1.0];
        let mut biased = Sampler::new(SamplingParams {
            logit_bias: vec![(3, 10.0), (99, 5.0)],
            ..SamplingParams::greedy()
        });
        assert_eq!(biased.sample(&logits), 3);
        // A presence penalty makes greedy decoding alternate between the
        // two best tokens: each loses 1 once it was sampled.
        let mut present = Sampler::new(SamplingParams {
            presence_penalty: 1.0,
            ..SamplingParams::greedy()
        });
        let seq: Vec<u32> = (0..4).map(|_| present.sample(&logits)).collect();
        assert_eq!(seq, [1, 2, 1, 1]);
        // A frequency penalty grows with every repeat: 3.0 - 0.5 c.
        let mut frequent = Sampler::new(SamplingParams {
            frequency_penalty: 0.5,
            ..SamplingParams::greedy()
        });
        let seq: Vec<u32> = (0..4).map(|_| frequent.sample(&logits)).collect();
        assert_eq!(seq, [1, 2, 1, 2]);
    }

    #[test]
    fn greedy_takes_argmax() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&[0.1, 3.0, 2.9, -1.0]), 1);
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..100).map(|i| (i % 7) as f32 * 0.3).collect();
        let params = SamplingParams {
            seed: Some(42),
            min_p: 0.0,
            ..Default::default()
        };
        let a: Vec<u32> = {
            let mut s = Sampler::new(params.clone());
            (0..50).map(|_| s.sample(&logits)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(params);
            (0..50).map(|_| s.sample(&logits)).collect()
        };
        assert_eq!(a, b);
        assert!(
            a.iter().any(|&t| t != a[0]),
            "temperature 1 over a flat-ish distribution varies"
        );
    }

    #[test]
    fn top_k_limits_candidates() {
        let logits = [5.0, 4.9, 4.8, 4.7, 0.0];
        let counts = sample_many(
            SamplingParams {
                top_k: 2,
                min_p: 0.0,
                seed: Some(1),
                ..Default::default()
            },
            &logits,
            2000,
        );
        assert_eq!(counts[2] + counts[3] + counts[4], 0);
        assert!(counts[0] > 0 && counts[1] > 0);
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        // p(4) / p(0) = e^-5 < 0.05: token 4 is dropped; tokens 0..3 survive.
        let logits = [5.0, 4.9, 4.8, 4.7, 0.0];
        let counts = sample_many(
            SamplingParams {
                seed: Some(3),
                ..Default::default()
            },
            &logits,
            4000,
        );
        assert_eq!(counts[4], 0);
        assert!(counts[..4].iter().all(|&c| c > 0));
    }

    #[test]
    fn top_p_keeps_smallest_nucleus() {
        // probabilities ~ [0.64, 0.24, 0.09, 0.03]: top_p 0.7 keeps two tokens.
        let logits = [2.0, 1.0, 0.0, -1.0];
        let counts = sample_many(
            SamplingParams {
                top_p: 0.7,
                min_p: 0.0,
                seed: Some(9),
                ..Default::default()
            },
            &logits,
            2000,
        );
        assert_eq!(counts[2] + counts[3], 0);
        assert!(counts[1] > 0);
    }

    #[test]
    fn low_temperature_sharpens() {
        let logits = [1.0, 0.5];
        let hot = sample_many(
            SamplingParams {
                temperature: 2.0,
                min_p: 0.0,
                seed: Some(5),
                ..Default::default()
            },
            &logits,
            4000,
        );
        let cold = sample_many(
            SamplingParams {
                temperature: 0.1,
                min_p: 0.0,
                seed: Some(5),
                ..Default::default()
            },
            &logits,
            4000,
        );
        assert!(cold[0] > hot[0]);
        assert!(cold[0] > 3900);
    }

    #[test]
    fn validate_rejects_bad_values() {
        assert!(SamplingParams {
            temperature: -1.0,
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(SamplingParams {
            top_p: 0.0,
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(SamplingParams {
            min_p: 1.5,
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(SamplingParams::default().validate().is_ok());
    }
}
