//! Stop strings over streamed text: text that could still become a stop
//! string is held back until it is known not to be one.

#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

/// What a push of text produced.
#[derive(Debug, PartialEq, Eq)]
pub enum StopEvent {
    /// Text that is safe to emit; generation goes on.
    Text(String),
    /// A stop string was found: the text before it, and which stop it was.
    Stopped { text: String, stop: String },
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
        }
    }

    pub fn push(&mut self, text: &str) -> StopEvent {
        self.pending.push_str(text);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|&(at, _)| at);
        if let Some((at, stop)) = first {
            let stop = stop.clone();
            let text = self.pending[..at].to_string();
            self.pending.clear();
            return StopEvent::Stopped { text, stop };
        }
        // Hold back the longest tail that is a prefix of some stop string.
        let hold = self
            .stops
            .iter()
            .flat_map(|s| {
                let p = &self.pending;
                (1..s.len().min(p.len() + 1))
                    .rev()
                    .find(|&n| p.is_char_boundary(p.len() - n) && s.starts_with(&p[p.len() - n..]))
            })
            .max()
            .unwrap_or(0);
        let emit_to = self.pending.len() - hold;
        let out = self.pending[..emit_to].to_string();
        self.pending.drain(..emit_to);
        StopEvent::Text(out)
    }

    /// Text held back when generation ends for another reason.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_split_across_pushes() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("hello E"), StopEvent::Text("hello ".into()));
        assert_eq!(m.push("N"), StopEvent::Text(String::new()));
        assert_eq!(
            m.push("D tail"),
            StopEvent::Stopped {
                text: String::new(),
                stop: "END".into()
            }
        );
    }

    #[test]
    fn false_start_is_released() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("EN"), StopEvent::Text(String::new()));
        assert_eq!(m.push("X"), StopEvent::Text("ENX".into()));
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn earliest_stop_wins_and_unicode_is_safe() {
        let mut m = StopMatcher::new(vec!["é!".into(), "b".into()]);
        assert_eq!(m.push("aé"), StopEvent::Text("a".into()));
        assert_eq!(
            m.push("xb"),
            StopEvent::Stopped {
                text: "éx".into(),
                stop: "b".into()
            }
        );
    }
}
