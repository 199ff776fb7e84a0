//! The agent's `/metrics` as the tests read it: the text format parsed into samples.

use std::collections::BTreeMap;

use anyhow::{bail, Context as _};

/// One sample of the text format.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed `/metrics` response.
#[derive(Clone, Debug)]
pub struct Scrape(pub Vec<Sample>);

/// `{a="x",b="y"}` (after the name) → labels and the rest of the line.
fn parse_labels(s: &str) -> anyhow::Result<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    let mut rest = s.strip_prefix('{').context("labels start with {")?;
    loop {
        rest = rest.trim_start_matches([' ', ',']);
        if let Some(after) = rest.strip_prefix('}') {
            return Ok((labels, after));
        }
        let (key, after) = rest.split_once("=\"").context("label without =\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next().context("unterminated label value")? {
                (i, '"') => break i,
                (_, '\\') => match chars.next().context("dangling escape")?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.insert(key.trim().to_owned(), value);
        rest = &after[end + 1..];
    }
}

impl Scrape {
    pub fn parse(text: &str) -> anyhow::Result<Scrape> {
        let mut samples = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let parse = || -> anyhow::Result<Sample> {
                let end = line.find(['{', ' ']).context("no value")?;
                let (name, rest) = line.split_at(end);
                let (labels, rest) = if rest.starts_with('{') {
                    parse_labels(rest)?
                } else {
                    (BTreeMap::new(), rest)
                };
                let value = rest.split_whitespace().next().context("no value")?;
                Ok(Sample {
                    name: name.to_owned(),
                    labels,
                    value: value.parse()?,
                })
            };
            samples.push(parse().with_context(|| format!("metrics line {line:?}"))?);
        }
        Ok(Scrape(samples))
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.0.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v))
        })
    }

    /// The sum of every series of `name` carrying all of `labels`; an error if there is none.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> anyhow::Result<f64> {
        let mut found = false;
        let sum = self
            .matching(name, labels)
            .inspect(|_| found = true)
            .map(|s| s.value)
            .sum();
        if !found {
            bail!("no series {name} with labels {labels:?} in /metrics");
        }
        Ok(sum)
    }

    /// The sum of every series of `name` carrying all of `labels`; 0 if there is none (a
    /// counter whose labels no event has made yet, e.g. a network's first release).
    pub fn count(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    /// Every series of `name` whose value differs from `before`, as `label=value,...` → the
    /// change. Comparing whole families shows what else moved, not just what a test expects.
    pub fn changes_since(&self, before: &Scrape, name: &str) -> BTreeMap<String, f64> {
        let mut changes = BTreeMap::new();
        for sample in self.matching(name, &[]) {
            let old = before
                .0
                .iter()
                .find(|s| s.name == sample.name && s.labels == sample.labels)
                .map_or(0.0, |s| s.value);
            if sample.value != old {
                let key = sample
                    .labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",");
                changes.insert(key, sample.value - old);
            }
        }
        changes
    }
}
