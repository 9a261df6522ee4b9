//! The broker's nodes as the checkout and its consumers are given them: one `amqp://` URL, or
//! the nodes of a cluster, comma-separated. Each new connection tries the node after the one
//! before, so that a node that died is left for the next one that lives.

#[derive(Clone, Debug)]
pub struct BrokerNodes {
    urls: Vec<String>,
    next: usize,
}

impl BrokerNodes {
    /// `amqp://a…,amqp://b…`: the nodes, in order (spaces around the commas allowed).
    pub fn parse(list: &str) -> BrokerNodes {
        let urls = list
            .split(',')
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .map(str::to_owned)
            .collect();
        BrokerNodes { urls, next: 0 }
    }

    /// The node to connect to now (the first, then each in turn); `None` if none was given.
    /// Returns its place in the list too (a log names the node by it, never by its URL,
    /// which holds a password).
    pub fn next_node(&mut self) -> Option<(usize, &str)> {
        if self.urls.is_empty() {
            return None;
        }
        let at = self.next % self.urls.len();
        self.next = at + 1;
        Some((at, &self.urls[at]))
    }

    pub fn len(&self) -> usize {
        self.urls.len()
    }

    pub fn is_empty(&self) -> bool {
        self.urls.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_connection_tries_the_next_node_in_turn() {
        let mut nodes = BrokerNodes::parse("amqp://a:1/%2f, amqp://b:2/%2f,");
        assert_eq!(nodes.len(), 2);
        let tried: Vec<usize> = (0..5).map(|_| nodes.next_node().unwrap().0).collect();
        assert_eq!(tried, [0, 1, 0, 1, 0]);
        assert_eq!(
            BrokerNodes::parse("amqp://only/").next_node(),
            Some((0, "amqp://only/"))
        );
        assert!(BrokerNodes::parse(" , ").next_node().is_none());
    }
}
