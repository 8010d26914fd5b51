//! A set of names that almost always holds one: the pods using a claim,
//! the nodes listing a volume in use, the attachments of a PV. A
//! `BTreeSet` allocates a whole node (eleven slots, about 280 bytes for
//! `String`s) for its first element; the member view keeps three such
//! sets per volume, so at 10,000 volumes they alone were 8 MiB. A sorted
//! `Vec` holds one name in 24 bytes, and stays a set (sorted, no
//! duplicates) for the few that hold more.

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameSet(Vec<String>);

impl NameSet {
    /// Adds `name`; `false` when it was there already.
    pub fn insert(&mut self, name: &str) -> bool {
        match self.0.binary_search_by(|n| n.as_str().cmp(name)) {
            Ok(_) => false,
            Err(at) => {
                self.0.insert(at, name.to_string());
                true
            }
        }
    }

    /// Removes `name`; `false` when it was not there.
    pub fn remove(&mut self, name: &str) -> bool {
        match self.0.binary_search_by(|n| n.as_str().cmp(name)) {
            Ok(at) => {
                self.0.remove(at);
                true
            }
            Err(_) => false,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The names, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, String> {
        self.0.iter()
    }
}

impl<'a> IntoIterator for &'a NameSet {
    type Item = &'a String;
    type IntoIter = std::slice::Iter<'a, String>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // It answers as a set would, whatever the order of the calls.
    #[test]
    fn behaves_as_an_ordered_set() {
        let mut set = NameSet::default();
        let mut model = std::collections::BTreeSet::new();
        let ops = [
            (true, "b"),
            (true, "a"),
            (true, "b"),
            (true, "c"),
            (false, "x"),
            (false, "a"),
            (true, "a"),
            (false, "b"),
            (false, "b"),
            (false, "c"),
            (false, "a"),
        ];
        for (add, name) in ops {
            let (got, want) = if add {
                (set.insert(name), model.insert(name.to_string()))
            } else {
                (set.remove(name), model.remove(name))
            };
            assert_eq!(got, want, "{add} {name}");
            assert_eq!(
                set.iter().collect::<Vec<_>>(),
                model.iter().collect::<Vec<_>>()
            );
            assert_eq!(set.is_empty(), model.is_empty());
        }
    }
}
