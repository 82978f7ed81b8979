//! The identifiers a check names: a leaf's (`namespace:key:selector:value:rate`), the
//! penalty record's, and those a pardon clears, written from the policy's fixed parts and
//! the request's selector values.

use super::{Error, Selectors};
use crate::identifier::{Identifier, push_value, same};
use crate::policy::{CompiledLeaf, CompiledPolicy, GroupAt};

/// The identifiers a pardon clears: each leaf whose selectors are all given (global leaves
/// only when none is), and the penalty record.
pub(super) fn reset_identifiers(
    policy: &CompiledPolicy,
    selectors: &Selectors<'_>,
) -> Vec<Identifier> {
    let mut ids = Vec::new();
    for leaf in &policy.leaves {
        let names = leaf.leaf.selector.names();
        if names.is_empty() != selectors.is_empty() {
            continue;
        }
        let mut id = Identifier::default();
        if write_leaf(&mut id, policy, leaf, selectors).is_ok() {
            ids.push(id);
        }
    }
    if policy.policy.penalty.is_some() {
        let mut id = Identifier::default();
        if write_penalty(&mut id, policy, selectors).is_ok() {
            ids.push(id);
        }
    }
    ids
}

#[inline(always)]
fn value<'a>(
    policy: &CompiledPolicy,
    selectors: &Selectors<'a>,
    name: &str,
) -> Result<&'a str, Error> {
    match selectors.iter().find(|(n, _)| same(n, name)) {
        Some((_, value)) => Ok(value),
        None => Err(missing_selector(policy, name)),
    }
}

/// Out of the way of every check's lookup, which is inlined.
#[cold]
fn missing_selector(policy: &CompiledPolicy, name: &str) -> Error {
    Error::MissingSelector {
        policy: policy.name().to_owned(),
        selector: name.to_owned(),
    }
}

/// Writes a leaf's identifier into `id` (empty).
pub(super) fn write_leaf(
    id: &mut Identifier,
    policy: &CompiledPolicy,
    leaf: &CompiledLeaf,
    selectors: &Selectors<'_>,
) -> Result<(), Error> {
    write(
        id,
        policy,
        (&leaf.prefix, leaf.leaf.selector.names(), &leaf.suffix),
        leaf.group,
        selectors,
    )
}

/// Writes a leaf's identifier into `id`, unless `id` holds it already: `id` was written
/// for `leaf` (or a clone) when `written` is true, and names the same counter if the
/// selector's value is the one it holds as it is (a hashed value is written anew).
/// Either way the same identifier, or the same missing-selector error, as [`write_leaf`];
/// `true` when `id` was kept as it was.
#[inline]
pub(super) fn write_leaf_again(
    id: &mut Identifier,
    written: bool,
    policy: &CompiledPolicy,
    leaf: &CompiledLeaf,
    selectors: &Selectors<'_>,
) -> Result<bool, Error> {
    let fixed = leaf.prefix.len() + leaf.suffix.len();
    match leaf.leaf.selector.names() {
        [] if written && id.len() == fixed => Ok(true),
        // The usual leaf: its one value is looked up once, whether it is written or not.
        [name] => {
            let value = value(policy, selectors, name)?;
            let held = id.get(leaf.prefix.len()..id.len().saturating_sub(leaf.suffix.len()));
            if written
                && id.len() >= fixed
                && held.is_some_and(|held| same(held, value))
                && !value.starts_with('#')
            {
                return Ok(true);
            }
            // Written for this leaf, `id` starts with its prefix already: only the value
            // and the suffix are written again.
            let start = leaf.prefix.len();
            if written && id.len() >= fixed {
                id.name_mut().truncate(start);
            } else {
                id.clear();
                id.name_mut().push_str(&leaf.prefix);
            }
            let name = id.name_mut();
            push_value(name, value);
            let end = name.len();
            name.push_str(&leaf.suffix);
            id.set_group(match leaf.group {
                GroupAt::Prefix(len) => 0..len,
                GroupAt::Value(_) => start..end,
            });
            Ok(false)
        }
        _ => {
            id.clear();
            write_leaf(id, policy, leaf, selectors).map(|()| false)
        }
    }
}

/// Writes the penalty record's identifier, `namespace:key:names:values:penalty`, into `id`
/// (empty). Counters end in a rate, which always holds a `/`, or in `:concurrent`, so a
/// penalty record can never share a counter's name.
pub(super) fn write_penalty(
    id: &mut Identifier,
    policy: &CompiledPolicy,
    selectors: &Selectors<'_>,
) -> Result<(), Error> {
    write(
        id,
        policy,
        (&policy.penalty_prefix, &policy.penalty_names, ":penalty"),
        policy.penalty_group,
        selectors,
    )
}

/// `prefix`, the values of `names` joined by `+`, `suffix`; routed by `group`.
fn write(
    id: &mut Identifier,
    policy: &CompiledPolicy,
    (prefix, names, suffix): (&str, &[String], &str),
    group: GroupAt,
    selectors: &Selectors<'_>,
) -> Result<(), Error> {
    let name = id.name_mut();
    name.push_str(prefix);
    let mut span = match group {
        GroupAt::Prefix(len) => 0..len,
        GroupAt::Value(_) => 0..0,
    };
    for (i, selector) in names.iter().enumerate() {
        if i > 0 {
            name.push('+');
        }
        let start = name.len();
        push_value(name, value(policy, selectors, selector)?);
        if group == GroupAt::Value(i) {
            span = start..name.len();
        }
    }
    name.push_str(suffix);
    id.set_group(span);
    Ok(())
}
