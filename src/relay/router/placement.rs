//! The two routing settings that are small languages of their own, parsed once at
//! start-up: `outbox.additional` placements (Debezium's
//! `table.fields.additional.placement`) and the `outbox.topic_regex` / `outbox.topic`
//! pair (Debezium's `route.topic.regex` / `route.topic.replacement`, which Kafka
//! Connect's `RegexRouter` applies with Java's `Matcher.matches()` and
//! `Matcher.replaceFirst`).

use regex::Regex;

/// Where an additional column goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// A record header named by the alias.
    Header,
    /// A field of the JSON envelope that then wraps the payload.
    Envelope,
    /// The record's partition (a non-negative integer column).
    Partition,
}

/// One parsed `outbox.additional` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdditionalField {
    /// Position in `outbox.additional`, for messages.
    pub index: usize,
    pub column: String,
    pub placement: Placement,
    /// Header or envelope field name: the alias when given, else the column name.
    /// Without effect for `partition`, as in Debezium.
    pub alias: String,
    /// The entry as configured, for messages.
    pub spec: String,
}

/// Parse `column:placement[:alias]` entries, pushing each problem (with its key path)
/// to `problems`.
pub fn parse_additional(specs: &[String], problems: &mut Vec<String>) -> Vec<AdditionalField> {
    let mut fields: Vec<AdditionalField> = Vec::with_capacity(specs.len());
    for (index, spec) in specs.iter().enumerate() {
        let path = format!("outbox.additional[{index}]");
        let parts: Vec<&str> = spec.split(':').collect();
        let (column, placement, alias) = match parts[..] {
            [column, placement] => (column, placement, None),
            [column, placement, alias] => (column, placement, Some(alias)),
            _ => {
                problems.push(format!(
                    "{path}: {spec:?} is not \"column:placement\" or \"column:placement:alias\""
                ));
                continue;
            }
        };
        if column.is_empty() {
            problems.push(format!("{path}: the column name is empty in {spec:?}"));
            continue;
        }
        let placement = match placement.trim().to_ascii_lowercase().as_str() {
            "header" => Placement::Header,
            "envelope" => Placement::Envelope,
            "partition" => Placement::Partition,
            _ => {
                problems.push(format!(
                    "{path}: unknown placement {placement:?} (header, envelope or partition)"
                ));
                continue;
            }
        };
        if alias == Some("") {
            problems.push(format!("{path}: the alias is empty in {spec:?}"));
            continue;
        }
        let alias = alias.unwrap_or(column).to_owned();
        let earlier = |wanted: &dyn Fn(&AdditionalField) -> bool| {
            fields.iter().find(|f| wanted(f)).map(|f| f.index)
        };
        match placement {
            Placement::Partition => {
                if let Some(first) = earlier(&|f| f.placement == Placement::Partition) {
                    problems.push(format!(
                        "{path}: a second partition placement (outbox.additional[{first}] is one already); a record has one partition"
                    ));
                    continue;
                }
            }
            Placement::Envelope if alias == "payload" => {
                problems.push(format!(
                    "{path}: the envelope field name \"payload\" is taken by the payload itself; give {column:?} another alias"
                ));
                continue;
            }
            Placement::Envelope => {
                if let Some(first) =
                    earlier(&|f| f.placement == Placement::Envelope && f.alias == alias)
                {
                    problems.push(format!(
                        "{path}: envelope field {alias:?} is already set by outbox.additional[{first}]"
                    ));
                    continue;
                }
            }
            Placement::Header => {}
        }
        fields.push(AdditionalField {
            index,
            column: column.to_owned(),
            placement,
            alias,
            spec: spec.clone(),
        });
    }
    fields
}

/// Topic = `topic` template expanded with the groups of `topic_regex` matched against the
/// whole route-by value. A value the regex does not match is not rerouted: as with
/// Debezium (whose `RegexRouter` then leaves the record's topic alone), the topic is the
/// route-by value itself.
#[derive(Debug, Clone)]
pub struct TopicRule {
    /// `topic_regex` anchored at both ends, as `Matcher.matches()` requires.
    anchored: Regex,
    template: Vec<TemplatePart>,
    /// The regex is one group around `.*` (the default, `(?<routedByValue>.*)`): it
    /// matches every value without a line break, and groups 0 and 1 are the whole value,
    /// so the topic needs no regex search (a tenth of the relay's CPU per event before).
    whole_value: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum TemplatePart {
    Literal(String),
    /// A capture group by index (0 = the whole value).
    Group(usize),
}

impl TopicRule {
    /// Compile the rule; problems go to `problems` with their key path.
    pub fn new(topic_regex: &str, topic: &str, problems: &mut Vec<String>) -> Option<Self> {
        // Compiled alone first: then wrapping it in anchors cannot change its meaning
        // (unbalanced parentheses would otherwise escape the wrapper).
        let standalone = match Regex::new(topic_regex) {
            Ok(regex) => regex,
            Err(e) => {
                problems.push(format!(
                    "outbox.topic_regex: not a valid regular expression (Rust regex syntax; no look-around or backreferences): {e}"
                ));
                return None;
            }
        };
        let anchored = match Regex::new(&format!(r"\A(?:{topic_regex})\z")) {
            Ok(regex) => regex,
            Err(e) => {
                problems.push(format!("outbox.topic_regex: {e}"));
                return None;
            }
        };
        // Only the exact spelling: any other pattern, however equivalent, is searched.
        let whole_value = matches!(
            topic_regex,
            "(.*)" | "(?<routedByValue>.*)" | "(?P<routedByValue>.*)"
        );
        match parse_template(topic, &standalone) {
            Ok(template) => Some(TopicRule {
                anchored,
                template,
                whole_value,
            }),
            Err(problem) => {
                problems.push(format!("outbox.topic: {problem}"));
                None
            }
        }
    }

    /// The template's text when it refers to no group: then every value the regex
    /// matches goes to this one topic.
    pub fn constant(&self) -> Option<String> {
        let mut topic = String::new();
        for part in &self.template {
            match part {
                TemplatePart::Literal(text) => topic.push_str(text),
                TemplatePart::Group(_) => return None,
            }
        }
        Some(topic)
    }

    /// The template's literal text before its first group.
    pub fn literal_prefix(&self) -> String {
        let mut prefix = String::new();
        for part in &self.template {
            match part {
                TemplatePart::Literal(text) => prefix.push_str(text),
                TemplatePart::Group(_) => break,
            }
        }
        prefix
    }

    /// The topic for one route-by value.
    pub fn topic(&self, routed_by: &str) -> String {
        // `.` matches anything but a line feed: a value with one falls through to the
        // search, which does not match it.
        if self.whole_value && !routed_by.contains('\n') {
            let mut topic = String::with_capacity(64);
            for part in &self.template {
                match part {
                    TemplatePart::Literal(text) => topic.push_str(text),
                    TemplatePart::Group(0 | 1) => topic.push_str(routed_by),
                    // Parsing refused groups the regex does not have.
                    TemplatePart::Group(_) => {}
                }
            }
            return topic;
        }
        let Some(captures) = self.anchored.captures(routed_by) else {
            return routed_by.to_owned();
        };
        let mut topic = String::with_capacity(64);
        for part in &self.template {
            match part {
                TemplatePart::Literal(text) => topic.push_str(text),
                // A group that took no part in the match adds nothing (Java's rule).
                TemplatePart::Group(index) => {
                    if let Some(group) = captures.get(*index) {
                        topic.push_str(group.as_str());
                    }
                }
            }
        }
        topic
    }
}

/// Java's replacement syntax: `$n` (the longest run of digits that names an existing
/// group), `${name}`, and `\` escaping the next character.
fn parse_template(template: &str, regex: &Regex) -> Result<Vec<TemplatePart>, String> {
    let group_count = regex.captures_len() - 1;
    let mut parts = Vec::new();
    let mut literal = String::new();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped) => literal.push(escaped),
                None => return Err("ends with a lone '\\' (write \\\\ for a backslash)".into()),
            },
            '$' => {
                let index = match chars.next() {
                    Some('{') => {
                        let mut name = String::new();
                        while let Some(&c) = chars.peek() {
                            if !c.is_ascii_alphanumeric() {
                                break;
                            }
                            name.push(c);
                            chars.next();
                        }
                        if chars.next() != Some('}') {
                            return Err(format!(
                                "\"${{{name}\" is not closed by '}}' (group names are letters and digits; write \\$ for a dollar sign)"
                            ));
                        }
                        regex
                            .capture_names()
                            .position(|n| n == Some(name.as_str()))
                            .ok_or_else(|| {
                                format!(
                                    "\"${{{name}}}\" names no group of outbox.topic_regex (it has {})",
                                    group_names(regex)
                                )
                            })?
                    }
                    Some(digit @ '0'..='9') => {
                        let mut index = digit as usize - '0' as usize;
                        if index > group_count {
                            return Err(format!(
                                "\"${index}\" refers to no group: outbox.topic_regex has {group_count}"
                            ));
                        }
                        while let Some(next) = chars.peek().and_then(|c| c.to_digit(10)) {
                            let longer = index * 10 + next as usize;
                            if longer > group_count {
                                break;
                            }
                            index = longer;
                            chars.next();
                        }
                        index
                    }
                    _ => {
                        return Err(
                            "'$' must be followed by a group number or {name} (write \\$ for a dollar sign)"
                                .into(),
                        )
                    }
                };
                if !literal.is_empty() {
                    parts.push(TemplatePart::Literal(std::mem::take(&mut literal)));
                }
                parts.push(TemplatePart::Group(index));
            }
            other => literal.push(other),
        }
    }
    if !literal.is_empty() {
        parts.push(TemplatePart::Literal(literal));
    }
    Ok(parts)
}

fn group_names(regex: &Regex) -> String {
    let names: Vec<String> = regex
        .capture_names()
        .flatten()
        .map(|n| format!("{n:?}"))
        .collect();
    if names.is_empty() {
        "no named groups".into()
    } else {
        format!("named groups {}", names.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn compile(regex: &str, topic: &str) -> Result<TopicRule, Vec<String>> {
        let mut problems = Vec::new();
        TopicRule::new(regex, topic, &mut problems).ok_or(problems)
    }

    #[test]
    fn additional_specs_parse_with_alias_defaulting_to_the_column() {
        let mut problems = Vec::new();
        let fields = parse_additional(
            &specs(&[
                "type:header:eventType",
                "aggregateid:Envelope",
                "shard:partition",
            ]),
            &mut problems,
        );
        assert!(problems.is_empty(), "{problems:?}");
        let got: Vec<_> = fields
            .iter()
            .map(|f| (f.index, f.column.as_str(), f.placement, f.alias.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (0, "type", Placement::Header, "eventType"),
                (1, "aggregateid", Placement::Envelope, "aggregateid"),
                (2, "shard", Placement::Partition, "shard"),
            ]
        );
    }

    #[test]
    fn bad_additional_specs_are_reported_with_their_path() {
        let mut problems = Vec::new();
        let fields = parse_additional(
            &specs(&[
                "a:header",
                "type:hedaer",
                "x",
                "a:b:c:d",
                ":header",
                "a:header:",
                "p:partition",
                "q:partition",
                "t:envelope:payload",
                "u:envelope:e",
                "v:envelope:e",
            ]),
            &mut problems,
        );
        assert_eq!(fields.len(), 3, "{fields:?}");
        let expect = [
            r#"outbox.additional[1]: unknown placement "hedaer" (header, envelope or partition)"#,
            r#"outbox.additional[2]: "x" is not"#,
            r#"outbox.additional[3]: "a:b:c:d" is not"#,
            "outbox.additional[4]: the column name is empty",
            "outbox.additional[5]: the alias is empty",
            "outbox.additional[7]: a second partition placement (outbox.additional[6]",
            r#"outbox.additional[8]: the envelope field name "payload" is taken"#,
            r#"outbox.additional[10]: envelope field "e" is already set by outbox.additional[9]"#,
        ];
        assert_eq!(problems.len(), expect.len(), "{problems:#?}");
        for (problem, want) in problems.iter().zip(expect) {
            assert!(problem.starts_with(want), "{problem}\n  wanted {want}");
        }
    }

    #[test]
    fn default_rule_puts_the_whole_value_in_the_template() {
        let rule = compile("(?<routedByValue>.*)", "outbox.event.${routedByValue}").unwrap();
        assert_eq!(rule.topic("Order"), "outbox.event.Order");
        assert_eq!(rule.topic(""), "outbox.event.");
    }

    #[test]
    fn regex_must_match_the_whole_value_else_the_value_is_the_topic() {
        let rule = compile(r"(?<kind>[a-z]+)_v(\d+)", "events.${kind}.v$2").unwrap();
        assert_eq!(rule.topic("order_v2"), "events.order.v2");
        // `find` would match inside; `matches()` semantics do not.
        assert_eq!(rule.topic("Xorder_v2"), "Xorder_v2");
        assert_eq!(rule.topic("order_v2x"), "order_v2x");
        // Alternation is matched as a whole, not left-first.
        let alt = compile("(a|ab)", "t-$1").unwrap();
        assert_eq!(alt.topic("ab"), "t-ab");
        // A group that did not take part adds nothing.
        let optional = compile("(x)?(y)", "t$1$2").unwrap();
        assert_eq!(optional.topic("y"), "ty");
    }

    #[test]
    fn template_uses_java_replacement_syntax() {
        let rule = compile("(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)(k)", r"$11-$12-\$-\\-$0").unwrap();
        // `$11` is group 11; `$12` is group 1 then "2" (there is no group 12).
        assert_eq!(rule.topic("abcdefghijk"), r"k-a2-$-\-abcdefghijk");
        let literal = compile("(?<routedByValue>.*)", "fixed.topic").unwrap();
        assert_eq!(literal.topic("anything"), "fixed.topic");
    }

    #[test]
    fn bad_regexes_and_templates_are_reported_with_their_path() {
        for (regex, topic, want) in [
            (
                "(unclosed",
                "t",
                "outbox.topic_regex: not a valid regular expression",
            ),
            (
                "a)|(b",
                "t",
                "outbox.topic_regex: not a valid regular expression",
            ),
            (r"(?<=a)b", "t", "outbox.topic_regex:"),
            (
                "(?<v>.*)",
                "t.${routedByValue}",
                r#"outbox.topic: "${routedByValue}" names no group of outbox.topic_regex (it has named groups "v")"#,
            ),
            ("(.*)", "t.$2", r#"outbox.topic: "$2" refers to no group"#),
            ("(.*)", "t.$x", "outbox.topic: '$' must be followed"),
            ("(.*)", "t.$", "outbox.topic: '$' must be followed"),
            ("(?<v>.*)", "t.${v", "outbox.topic: \"${v\" is not closed"),
            ("(.*)", "t.\\", "outbox.topic: ends with a lone"),
        ] {
            let problems = compile(regex, topic).unwrap_err();
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert!(
                problems[0].starts_with(want),
                "{regex} {topic}: {}",
                problems[0]
            );
        }
    }

    #[test]
    fn a_template_without_groups_is_a_constant_topic() {
        assert_eq!(
            compile("(?<routedByValue>.*)", "events")
                .unwrap()
                .constant(),
            Some("events".into())
        );
        assert_eq!(
            compile("(?<routedByValue>.*)", "a\\$b").unwrap().constant(),
            Some("a$b".into())
        );
        assert_eq!(
            compile("(?<routedByValue>.*)", "outbox.event.${routedByValue}")
                .unwrap()
                .constant(),
            None
        );
        assert_eq!(compile("(.*)", "$1").unwrap().constant(), None);
    }
}
