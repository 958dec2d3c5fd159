//! The service's configuration: envoyproxy/ratelimit's YAML, read as that
//! service reads it, with tollgate's own keys beside its.
//!
//! ```yaml
//! domain: shop
//! descriptors:
//!   - key: remote_address          # every address its own counter
//!     rate_limit:
//!       unit: second
//!       requests_per_unit: 10
//!   - key: path
//!     value: /checkout
//!     rate_limit:
//!       name: checkout
//!       unit: minute
//!       requests_per_unit: 100
//!       algorithm: gcra            # tollgate's: the algorithm, the burst
//!       burst: 20
//!     shadow_mode: true
//! ```
//!
//! A descriptor entry of a request matches a rule of its level by its key
//! and value first, then by a rule whose value ends in `*` and prefixes the
//! entry's value, then by a rule of its key alone (every value its own
//! counter). A request's descriptor takes the limit of the rule its last
//! entry matched, if every entry matched one: a descriptor longer or
//! shorter than the rules is not limited.
//!
//! Every error names the file, the line and column, and the rule (its path
//! of `key` and `value`), and nothing of a configuration with an error is
//! used.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use marked_yaml::types::{MarkedMappingNode, MarkedScalarNode};
use marked_yaml::{Node, Span};
use tollgate::Quota;

/// The keys envoyproxy/ratelimit reads, and tollgate's own (`algorithm`,
/// `burst`, `mode`). Any other is refused, as that service refuses it.
const DOMAIN_KEYS: [&str; 2] = ["domain", "descriptors"];
const DESCRIPTOR_KEYS: [&str; 6] = [
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "detailed_metric",
];
const RATE_LIMIT_KEYS: [&str; 8] = [
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "algorithm",
    "burst",
    "mode",
];

/// A configuration: every domain's rules, as loaded from one or more files.
#[derive(Debug, Default)]
pub struct Config {
    domains: HashMap<String, Level>,
    /// Every limited rule's path, and where it is: a path names one rule
    /// (its limiter and its statistics).
    paths: HashMap<String, Origin>,
}

/// The rules of one level of a domain's tree, by how an entry matches them.
#[derive(Debug, Default)]
struct Level {
    /// By `key`, then `value`.
    exact: HashMap<String, HashMap<String, Arc<Descriptor>>>,
    /// By `key` and a value prefix (a configured value ending in `*`), in
    /// the file's order: the first that matches.
    prefixed: Vec<(String, String, Arc<Descriptor>)>,
    /// By `key` alone.
    any_value: HashMap<String, Arc<Descriptor>>,
}

/// A configured descriptor: its limit, if any, and the level below it.
#[derive(Debug)]
struct Descriptor {
    rule: Option<Arc<Rule>>,
    below: Level,
}

/// A limit of the configuration: what a matched descriptor is held to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The rule's identity: its domain and path of keys and values
    /// (`shop.path_/checkout`), as envoyproxy/ratelimit names its
    /// statistics. A reload keeps the state of a rule of the same path.
    pub path: String,
    /// Its `name`, if it has one (what `replaces` refers to).
    pub name: Option<String>,
    /// Its limit, or none (`unlimited: true`).
    pub limit: Option<Limit>,
    /// Decided and counted, but never refused (`shadow_mode`).
    pub shadow_mode: bool,
    /// The names of the rules this one replaces in a request that matches
    /// both.
    pub replaces: Vec<String>,
    /// Statistics per value of a key-only descriptor (`detailed_metric`).
    pub detailed_metric: bool,
    /// Where it is configured.
    pub origin: Origin,
}

/// A rule's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// `requests_per_unit`.
    pub requests_per_unit: u32,
    /// `unit`.
    pub unit: Unit,
    /// The quota: `requests_per_unit` a `unit`, with `burst` if given.
    pub quota: Quota,
    /// `algorithm` (default: the fixed window, as envoyproxy/ratelimit
    /// counts).
    pub algorithm: Algorithm,
    /// `mode`: how a Redis backend decides (ignored in memory).
    pub mode: Mode,
}

/// The units of `rate_limit.unit`, as Envoy's protocol names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// `second`.
    Second,
    /// `minute`.
    Minute,
    /// `hour`.
    Hour,
    /// `day`.
    Day,
    /// `week`: seven days.
    Week,
    /// `month`: thirty days, as envoyproxy/ratelimit counts one.
    Month,
    /// `year`: 365 days, likewise.
    Year,
}

impl Unit {
    const NAMES: [(&'static str, Unit); 7] = [
        ("second", Unit::Second),
        ("minute", Unit::Minute),
        ("hour", Unit::Hour),
        ("day", Unit::Day),
        ("week", Unit::Week),
        ("month", Unit::Month),
        ("year", Unit::Year),
    ];

    /// The unit named `name`, in any case (`SECOND` and `second`).
    #[must_use]
    pub fn from_name(name: &str) -> Option<Unit> {
        Self::NAMES
            .iter()
            .find(|(known, _)| known.eq_ignore_ascii_case(name))
            .map(|&(_, unit)| unit)
    }

    /// The unit's span.
    #[must_use]
    pub const fn span(self) -> Duration {
        const DAY: u64 = 86_400;
        Duration::from_secs(match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => DAY,
            Unit::Week => 7 * DAY,
            Unit::Month => 30 * DAY,
            Unit::Year => 365 * DAY,
        })
    }
}

/// `rate_limit.algorithm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// `fixed_window` (the default).
    FixedWindow,
    /// `gcra`.
    Gcra,
    /// `token_bucket`.
    TokenBucket,
    /// `sliding_window_counter`.
    SlidingWindowCounter,
    /// `sliding_window_log`.
    SlidingWindowLog,
}

impl Algorithm {
    const NAMES: [(&'static str, Algorithm); 5] = [
        ("fixed_window", Algorithm::FixedWindow),
        ("gcra", Algorithm::Gcra),
        ("token_bucket", Algorithm::TokenBucket),
        ("sliding_window_counter", Algorithm::SlidingWindowCounter),
        ("sliding_window_log", Algorithm::SlidingWindowLog),
    ];
}

/// `rate_limit.mode`: how a rule is decided on a Redis backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// `exact` (the default): every check a round trip.
    #[default]
    Exact,
    /// `deny_cached`: denials known locally are decided locally.
    DenyCached,
    /// `leased`: admissions from leases of units, GCRA only.
    Leased,
}

impl Mode {
    const NAMES: [(&'static str, Mode); 3] = [
        ("exact", Mode::Exact),
        ("deny_cached", Mode::DenyCached),
        ("leased", Mode::Leased),
    ];
}

/// Where something is configured: a file, a line and a column (from 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The file.
    pub file: Arc<Path>,
    /// The line, from 1.
    pub line: usize,
    /// The column, from 1.
    pub column: usize,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file.display(), self.line, self.column)
    }
}

/// A configuration refused: where, which rule, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: {rule}: {reason}")]
pub struct ConfigError {
    /// Where the error is.
    pub origin: Origin,
    /// The rule it is in: the domain and the path of keys and values down
    /// to it (the file, for an error outside every rule).
    pub rule: String,
    /// What is wrong.
    pub reason: String,
}

/// A file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Reading `path` failed.
    #[error("{path}: {source}")]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file's configuration is refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

impl Config {
    /// Loads every `.yaml` and `.yml` file of `path` (a file, or a
    /// directory read in the order of the files' names).
    ///
    /// # Errors
    ///
    /// [`LoadError::Read`] for a file or directory that cannot be read,
    /// [`LoadError::Config`] for the first error of any file.
    pub fn load(path: &Path) -> Result<Config, LoadError> {
        let read_error = |source| LoadError::Read {
            path: path.to_owned(),
            source,
        };
        let files = if path.is_dir() {
            let mut files = Vec::new();
            for entry in std::fs::read_dir(path).map_err(read_error)? {
                let file = entry.map_err(read_error)?.path();
                let yaml = file
                    .extension()
                    .is_some_and(|extension| extension == "yaml" || extension == "yml");
                if yaml && file.is_file() {
                    files.push(file);
                }
            }
            files.sort();
            files
        } else {
            vec![path.to_owned()]
        };
        let mut config = Config::default();
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|source| LoadError::Read {
                path: file.clone(),
                source,
            })?;
            config.add(&file, &text)?;
        }
        Ok(config)
    }

    /// Reads one file's text (named `file` in errors).
    ///
    /// # Errors
    ///
    /// The first [`ConfigError`] in it.
    pub fn parse(file: &Path, text: &str) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        config.add(file, text)?;
        Ok(config)
    }

    /// Adds one file's domain.
    fn add(&mut self, file: &Path, text: &str) -> Result<(), ConfigError> {
        let reader = Reader {
            file: Arc::from(file),
        };
        if let Some((line, column)) = too_deep(text) {
            return Err(ConfigError {
                origin: Origin {
                    file: reader.file.clone(),
                    line,
                    column,
                },
                rule: file.display().to_string(),
                reason: format!("nested deeper than {DEEPEST} columns, which this service reads"),
            });
        }
        let options = marked_yaml::LoaderOptions::default().error_on_duplicate_keys(true);
        let root = marked_yaml::parse_yaml_with_options(0, text, options)
            .map_err(|error| reader.load_error(&error))?;
        let root = reader.mapping(&root, &file.display().to_string())?;
        reader.known_keys(root, &DOMAIN_KEYS, &file.display().to_string())?;
        let domain_node = root
            .get_node("domain")
            .ok_or_else(|| reader.error(start(root), &file.display().to_string(), "no `domain`"))?;
        let domain = reader.string(domain_node, "the file")?;
        if domain.is_empty() {
            return Err(reader.error(domain_node.span(), "the file", "an empty `domain`"));
        }
        if self.domains.contains_key(&domain) {
            return Err(reader.error(
                domain_node.span(),
                &domain,
                "a domain configured twice (once in another file)",
            ));
        }
        let mut names = HashMap::new();
        let level = match root.get_node("descriptors") {
            Some(descriptors) if !is_null(descriptors) => {
                reader.level(descriptors, &domain, &mut names)?
            }
            _ => Level::default(),
        };
        // `replaces` names a rule of the domain.
        replaced_exist(&level, &names)?;
        // Each path one rule, in the order the files give them (a key or a
        // value holding `.` or `_` can make two rules one path).
        let mut rules: Vec<&Arc<Rule>> = level.rules().collect();
        rules.sort_by_key(|rule| (rule.origin.line, rule.origin.column));
        let mut paths = HashMap::new();
        for rule in rules {
            if let Some(first) = self.paths.get(&rule.path).or(paths.get(&rule.path)) {
                return Err(ConfigError {
                    origin: rule.origin.clone(),
                    rule: rule.path.clone(),
                    reason: format!(
                        "the path of the rule at {first} too (a key or value holding `.` or `_`)"
                    ),
                });
            }
            paths.insert(rule.path.clone(), rule.origin.clone());
        }
        self.paths.extend(paths);
        self.domains.insert(domain, level);
        Ok(())
    }

    /// Whether `domain` is configured.
    #[must_use]
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The rule a request's descriptor of `entries` (key, value) in
    /// `domain` matches, if any.
    pub fn matches<'a>(
        &self,
        domain: &str,
        entries: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Option<Arc<Rule>> {
        let mut level = self.domains.get(domain)?;
        let mut entries = entries.into_iter().peekable();
        entries.peek()?;
        while let Some((key, value)) = entries.next() {
            let descriptor = level.matches(key, value)?;
            if entries.peek().is_none() {
                return descriptor.rule.clone();
            }
            level = &descriptor.below;
        }
        None
    }

    /// Every rule, in the order the files give them (by file, then line):
    /// a configuration is refused for the first rule it cannot hold.
    pub fn rules(&self) -> impl Iterator<Item = &Arc<Rule>> {
        let mut rules: Vec<&Arc<Rule>> = self.domains.values().flat_map(Level::rules).collect();
        rules.sort_by(|a, b| {
            (&a.origin.file, a.origin.line, a.origin.column).cmp(&(
                &b.origin.file,
                b.origin.line,
                b.origin.column,
            ))
        });
        rules.into_iter()
    }
}

impl Level {
    fn matches(&self, key: &str, value: &str) -> Option<&Descriptor> {
        self.exact
            .get(key)
            .and_then(|values| values.get(value))
            .map(|descriptor| &**descriptor)
            .or_else(|| {
                self.prefixed
                    .iter()
                    .find(|(k, prefix, _)| k == key && value.starts_with(prefix.as_str()))
                    .map(|(_, _, descriptor)| &**descriptor)
            })
            .or_else(|| self.any_value.get(key).map(|descriptor| &**descriptor))
    }

    fn rules(&self) -> Box<dyn Iterator<Item = &Arc<Rule>> + '_> {
        let descriptors = self
            .exact
            .values()
            .flat_map(HashMap::values)
            .chain(self.prefixed.iter().map(|(_, _, descriptor)| descriptor))
            .chain(self.any_value.values());
        Box::new(
            descriptors
                .flat_map(|descriptor| descriptor.rule.iter().chain(descriptor.below.rules())),
        )
    }
}

/// The span of `mapping`'s key `key` (a mapping's own span starts at its
/// first key's colon).
fn key_span<'n>(mapping: &'n MarkedMappingNode, key: &str) -> Option<&'n Span> {
    mapping
        .iter()
        .find(|(name, _)| name.as_str() == key)
        .map(|(name, _)| name.span())
}

/// The most columns a line of a file may be nested to: the YAML loader
/// recurses once a level, and a file nested deeper could exhaust a thread's
/// stack rather than be refused.
const DEEPEST: usize = 256;

/// The first line nested past [`DEEPEST`] columns (its indentation and
/// the `- ` of the sequences opened on it), as (line, column) from 1.
fn too_deep(text: &str) -> Option<(usize, usize)> {
    text.lines().enumerate().find_map(|(index, line)| {
        let mut rest = line.trim_start_matches([' ', '\t']);
        let mut column = line.len() - rest.len();
        while let Some(after) = rest.strip_prefix('-') {
            let content = after.trim_start_matches([' ', '\t']);
            if content.len() == after.len() {
                break;
            }
            column += rest.len() - content.len();
            rest = content;
        }
        (column > DEEPEST).then_some((index + 1, column + 1))
    })
}

/// Whether `node` is YAML's null (`~`, `null`, or nothing).
fn is_null(node: &Node) -> bool {
    node.as_scalar()
        .is_some_and(|scalar| matches!(scalar.as_str(), "" | "~" | "null" | "Null" | "NULL"))
}

/// Where `mapping` starts: its first key.
fn start(mapping: &MarkedMappingNode) -> &Span {
    mapping
        .iter()
        .next()
        .map_or(mapping.span(), |(key, _)| key.span())
}

/// Reads one file's nodes, naming it in errors.
struct Reader {
    file: Arc<Path>,
}

impl Reader {
    fn origin(&self, span: &Span) -> Origin {
        let (line, column) = span
            .start()
            .map_or((1, 1), |marker| (marker.line(), marker.column()));
        Origin {
            file: self.file.clone(),
            line,
            column,
        }
    }

    fn error(&self, span: &Span, rule: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            origin: self.origin(span),
            rule: rule.to_owned(),
            reason: reason.into(),
        }
    }

    fn load_error(&self, error: &marked_yaml::LoadError) -> ConfigError {
        use marked_yaml::LoadError as Load;
        let (marker, reason) = match error {
            Load::TopLevelMustBeMapping(marker) => {
                (Some(*marker), "the file is not a mapping".into())
            }
            Load::TopLevelMustBeSequence(marker) => {
                (Some(*marker), "a list where a mapping belongs".into())
            }
            Load::UnexpectedAnchor(marker) => {
                (Some(*marker), "a YAML anchor, which is not read".into())
            }
            Load::MappingKeyMustBeScalar(marker) => {
                (Some(*marker), "a key that is not a single value".into())
            }
            Load::UnexpectedTag(marker) => (Some(*marker), "a YAML tag, which is not read".into()),
            Load::ScanError(marker, scan) => (Some(*marker), format!("not YAML: {scan}")),
            Load::DuplicateKey(keys) => (
                keys.key.span().start().copied(),
                format!("the key `{}` twice in one mapping", keys.key.as_str()),
            ),
        };
        let (line, column) = marker.map_or((1, 1), |marker| (marker.line(), marker.column()));
        ConfigError {
            origin: Origin {
                file: self.file.clone(),
                line,
                column,
            },
            rule: self.file.display().to_string(),
            reason,
        }
    }

    fn mapping<'n>(
        &self,
        node: &'n Node,
        rule: &str,
    ) -> Result<&'n MarkedMappingNode, ConfigError> {
        node.as_mapping()
            .ok_or_else(|| self.error(node.span(), rule, "a mapping expected"))
    }

    fn scalar<'n>(&self, node: &'n Node, rule: &str) -> Result<&'n MarkedScalarNode, ConfigError> {
        node.as_scalar()
            .ok_or_else(|| self.error(node.span(), rule, "a single value expected"))
    }

    fn string(&self, node: &Node, rule: &str) -> Result<String, ConfigError> {
        Ok(self.scalar(node, rule)?.as_str().to_owned())
    }

    fn boolean(&self, node: &Node, rule: &str, key: &str) -> Result<bool, ConfigError> {
        // YAML 1.1's booleans, as the reference's loader reads them.
        match self.scalar(node, rule)?.as_str() {
            "true" | "True" | "TRUE" | "yes" | "Yes" | "YES" | "y" | "Y" | "on" | "On" | "ON" => {
                Ok(true)
            }
            "false" | "False" | "FALSE" | "no" | "No" | "NO" | "n" | "N" | "off" | "Off"
            | "OFF" => Ok(false),
            other => Err(self.error(
                node.span(),
                rule,
                format!("`{key}` is true or false, not {other:?}"),
            )),
        }
    }

    fn count(&self, node: &Node, rule: &str, key: &str) -> Result<u32, ConfigError> {
        let text = self.scalar(node, rule)?.as_str();
        // A leading zero is refused: YAML 1.1 (the reference's loader)
        // reads `010` as 8.
        let leading_zero = text.len() > 1 && text.starts_with('0');
        text.parse::<u32>()
            .ok()
            .filter(|_| !leading_zero)
            .ok_or_else(|| {
                self.error(
                    node.span(),
                    rule,
                    format!(
                        "`{key}` is a whole number from 0 to {}, in decimal, not {text:?}",
                        u32::MAX
                    ),
                )
            })
    }

    fn named<T: Copy>(
        &self,
        node: &Node,
        rule: &str,
        key: &str,
        names: &[(&str, T)],
    ) -> Result<T, ConfigError> {
        let text = self.scalar(node, rule)?.as_str();
        names
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(text))
            .map(|&(_, value)| value)
            .ok_or_else(|| {
                let known: Vec<&str> = names.iter().map(|(name, _)| *name).collect();
                self.error(
                    node.span(),
                    rule,
                    format!("`{key}` is one of {}, not {text:?}", known.join(", ")),
                )
            })
    }

    /// Refuses a key of `mapping` not in `known`, as envoyproxy/ratelimit
    /// does (a misspelt `shadow_mode` would otherwise enforce a limit meant
    /// to be watched).
    fn known_keys(
        &self,
        mapping: &MarkedMappingNode,
        known: &[&str],
        rule: &str,
    ) -> Result<(), ConfigError> {
        for (key, _) in mapping.iter() {
            if !known.contains(&key.as_str()) {
                return Err(self.error(
                    key.span(),
                    rule,
                    format!(
                        "unknown key `{}` (known: {})",
                        key.as_str(),
                        known.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Reads a sequence of descriptors under `parent` (the path so far).
    fn level(
        &self,
        node: &Node,
        parent: &str,
        names: &mut HashMap<String, Origin>,
    ) -> Result<Level, ConfigError> {
        let sequence = node
            .as_sequence()
            .ok_or_else(|| self.error(node.span(), parent, "`descriptors` is a list"))?;
        let mut level = Level::default();
        let mut seen = HashSet::new();
        for item in sequence.iter() {
            let mapping = self.mapping(item, parent)?;
            self.known_keys(mapping, &DESCRIPTOR_KEYS, parent)?;
            let key_node = mapping
                .get_node("key")
                .ok_or_else(|| self.error(start(mapping), parent, "a descriptor with no `key`"))?;
            let key = self.string(key_node, parent)?;
            if key.is_empty() {
                return Err(self.error(
                    key_node.span(),
                    parent,
                    "a descriptor with an empty `key`",
                ));
            }
            // No value, or a null one (`~`): the key alone, as the
            // reference reads it.
            let value = match mapping.get_node("value") {
                Some(value) if !is_null(value) => self.string(value, parent)?,
                _ => String::new(),
            };
            let path = if value.is_empty() {
                format!("{parent}.{key}")
            } else {
                format!("{parent}.{key}_{value}")
            };
            if !seen.insert((key.clone(), value.clone())) {
                return Err(self.error(
                    key_node.span(),
                    &path,
                    "a descriptor configured twice at one level",
                ));
            }
            let rule = if let Some(rate_limit) = mapping.get_node("rate_limit") {
                let at = key_span(mapping, "rate_limit").unwrap_or(rate_limit.span());
                Some(Arc::new(self.rule(rate_limit, at, mapping, &path, names)?))
            } else {
                for flag in ["shadow_mode", "detailed_metric"] {
                    if let Some(node) = mapping.get_node(flag) {
                        // Read, so that a bad value is refused, but
                        // without a limit it has nothing to act on.
                        self.boolean(node, &path, flag)?;
                    }
                }
                None
            };
            let below = match mapping.get_node("descriptors") {
                Some(descriptors) if !is_null(descriptors) => {
                    self.level(descriptors, &path, names)?
                }
                _ => Level::default(),
            };
            let descriptor = Arc::new(Descriptor { rule, below });
            if value.is_empty() {
                level.any_value.insert(key, descriptor);
            } else if let Some(prefix) = value.strip_suffix('*') {
                level.prefixed.push((key, prefix.to_owned(), descriptor));
            } else {
                level
                    .exact
                    .entry(key)
                    .or_default()
                    .insert(value, descriptor);
            }
        }
        Ok(level)
    }

    /// Reads a descriptor's `rate_limit` (and its flags) as the rule `path`.
    fn rule(
        &self,
        node: &Node,
        at: &Span,
        descriptor: &MarkedMappingNode,
        path: &str,
        names: &mut HashMap<String, Origin>,
    ) -> Result<Rule, ConfigError> {
        let mapping = self.mapping(node, path)?;
        self.known_keys(mapping, &RATE_LIMIT_KEYS, path)?;
        let flag = |key| {
            descriptor
                .get_node(key)
                .map_or(Ok(false), |node| self.boolean(node, path, key))
        };
        let (shadow_mode, detailed_metric) = (flag("shadow_mode")?, flag("detailed_metric")?);
        let unlimited = match mapping.get_node("unlimited") {
            Some(node) => self.boolean(node, path, "unlimited")?,
            None => false,
        };
        let name = match mapping.get_node("name") {
            Some(node) => {
                let name = self.string(node, path)?;
                if name.is_empty() {
                    return Err(self.error(node.span(), path, "an empty `name`"));
                }
                if let Some(first) = names.insert(name.clone(), self.origin(node.span())) {
                    return Err(self.error(
                        node.span(),
                        path,
                        format!("the name `{name}` is taken by the rule at {first}"),
                    ));
                }
                Some(name)
            }
            None => None,
        };
        let mut replaces = Vec::new();
        if let Some(node) = mapping.get_node("replaces") {
            let list = node
                .as_sequence()
                .ok_or_else(|| self.error(node.span(), path, "`replaces` is a list"))?;
            for entry in list.iter() {
                let entry_mapping = self.mapping(entry, path)?;
                self.known_keys(entry_mapping, &["name"], path)?;
                let target = entry_mapping
                    .get_node("name")
                    .map(|name| self.string(name, path))
                    .transpose()?
                    .unwrap_or_default();
                if target.is_empty() {
                    return Err(self.error(
                        start(entry_mapping),
                        path,
                        "a `replaces` entry with no `name`",
                    ));
                }
                if name.as_deref() == Some(target.as_str()) {
                    return Err(self.error(
                        start(entry_mapping),
                        path,
                        "a rule that replaces itself",
                    ));
                }
                replaces.push(target);
            }
        }
        let limit = if unlimited {
            // The reference ignores a count beside `unlimited`, and refuses
            // a unit; the keys of tollgate's own are refused too.
            for key in ["unit", "algorithm", "burst", "mode"] {
                if let Some(node) = mapping.get_node(key) {
                    return Err(self.error(
                        node.span(),
                        path,
                        format!("an unlimited rule with a `{key}`"),
                    ));
                }
            }
            None
        } else {
            Some(self.limit(at, mapping, path)?)
        };
        Ok(Rule {
            path: path.to_owned(),
            name,
            limit,
            shadow_mode,
            replaces,
            detailed_metric,
            origin: self.origin(at),
        })
    }

    /// Reads the limit of the `rate_limit` mapping `mapping`, whose key is
    /// `at`.
    fn limit(
        &self,
        at: &Span,
        mapping: &MarkedMappingNode,
        path: &str,
    ) -> Result<Limit, ConfigError> {
        let required = |key: &str| {
            mapping
                .get_node(key)
                .ok_or_else(|| self.error(at, path, format!("a limit with no `{key}`")))
        };
        let unit_node = required("unit")?;
        let unit_text = self.scalar(unit_node, path)?.as_str();
        let unit = Unit::from_name(unit_text).ok_or_else(|| {
            let known: Vec<&str> = Unit::NAMES.iter().map(|(name, _)| *name).collect();
            self.error(
                unit_node.span(),
                path,
                format!("`unit` is one of {}, not {unit_text:?}", known.join(", ")),
            )
        })?;
        let count_node = required("requests_per_unit")?;
        let requests_per_unit = self.count(count_node, path, "requests_per_unit")?;
        let algorithm = match mapping.get_node("algorithm") {
            Some(node) => self.named(node, path, "algorithm", &Algorithm::NAMES)?,
            None => Algorithm::FixedWindow,
        };
        let mode = match mapping.get_node("mode") {
            Some(node) => self.named(node, path, "mode", &Mode::NAMES)?,
            None => Mode::Exact,
        };
        let quota = Quota::new(requests_per_unit, unit.span())
            .map_err(|error| self.error(count_node.span(), path, error.to_string()))?;
        let quota = match mapping.get_node("burst") {
            Some(node) => {
                let burst = self.count(node, path, "burst")?;
                if matches!(
                    algorithm,
                    Algorithm::FixedWindow
                        | Algorithm::SlidingWindowCounter
                        | Algorithm::SlidingWindowLog
                ) && burst != requests_per_unit
                {
                    return Err(self.error(
                        node.span(),
                        path,
                        "a window algorithm counts `requests_per_unit` a window: a `burst` is for \
                         gcra and token_bucket",
                    ));
                }
                quota
                    .with_burst(burst)
                    .map_err(|error| self.error(node.span(), path, error.to_string()))?
            }
            None => quota,
        };
        if mode == Mode::Leased && algorithm != Algorithm::Gcra {
            return Err(self.error(
                mapping.get_node("mode").map_or(at, Node::span),
                path,
                "`mode: leased` needs `algorithm: gcra`",
            ));
        }
        Ok(Limit {
            requests_per_unit,
            unit,
            quota,
            algorithm,
            mode,
        })
    }
}

/// Refuses a `replaces` that names no rule of the domain.
fn replaced_exist(level: &Level, names: &HashMap<String, Origin>) -> Result<(), ConfigError> {
    for rule in level.rules() {
        for replaced in &rule.replaces {
            if !names.contains_key(replaced) {
                return Err(ConfigError {
                    origin: rule.origin.clone(),
                    rule: rule.path.clone(),
                    reason: format!(
                        "`replaces` names `{replaced}`, which no rule of the domain is named"
                    ),
                });
            }
        }
    }
    Ok(())
}
