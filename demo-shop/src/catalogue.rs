//! What the demo shop sells, and how a submitted cart becomes line items.

use std::collections::HashMap;

use checkout_shared::LineItem;

pub struct Product {
    /// The cart form's field: `qty_<sku>`.
    pub sku: &'static str,
    pub name: &'static str,
    pub description: &'static str,
    /// Kopecks.
    pub price: i64,
}

pub const CATALOGUE: [Product; 4] = [
    Product {
        sku: "ethiopia",
        name: "Кофе в зёрнах «Эфиопия», 250 г",
        description: "Светлая обжарка, ноты жасмина и бергамота",
        price: 15_000,
    },
    Product {
        sku: "filters",
        name: "Фильтры для пуровера, 100 шт.",
        description: "Бумажные, для воронки V60",
        price: 15_000,
    },
    Product {
        sku: "grinder",
        name: "Кофемолка ручная",
        description: "Керамические жернова, 30 ступеней помола",
        price: 70_000,
    },
    Product {
        sku: "chocolate",
        name: "Шоколад горький 72 %",
        description: "Плитка 50 г",
        price: 4_000,
    },
];

/// Most of one product in a cart.
pub const MAX_QUANTITY: u32 = 20;

/// The line items of a submitted cart form (`qty_<sku>` fields); empty lines are left out.
pub fn cart(form: &HashMap<String, String>) -> Result<Vec<LineItem>, String> {
    let mut items = Vec::new();
    for product in &CATALOGUE {
        let field = form
            .get(&format!("qty_{}", product.sku))
            .map(|v| v.trim())
            .unwrap_or("");
        if field.is_empty() {
            continue;
        }
        let quantity: u32 = field
            .parse()
            .ok()
            .filter(|q| *q <= MAX_QUANTITY)
            .ok_or_else(|| {
                format!(
                    "Количество «{}» должно быть числом от 0 до {MAX_QUANTITY}",
                    product.name
                )
            })?;
        if quantity > 0 {
            items.push(LineItem {
                name: product.name.into(),
                quantity,
                unit_price: product.price,
            });
        }
    }
    if items.is_empty() {
        return Err("Корзина пуста: выберите хотя бы один товар".into());
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(fields: &[(&str, &str)]) -> HashMap<String, String> {
        fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_cart_is_its_non_empty_lines() {
        let items = cart(&form(&[
            ("qty_ethiopia", "2"),
            ("qty_filters", "1"),
            ("qty_grinder", "0"),
            ("qty_chocolate", ""),
        ]))
        .unwrap();
        assert_eq!(items.len(), 2);
        let total: i64 = items.iter().map(|i| i.total().unwrap()).sum();
        assert_eq!(total, 45_000);
    }

    #[test]
    fn bad_carts_are_refused_in_russian() {
        assert!(cart(&form(&[])).unwrap_err().contains("Корзина пуста"));
        for bad in ["-1", "abc", "21", "1.5"] {
            assert!(
                cart(&form(&[("qty_grinder", bad)]))
                    .unwrap_err()
                    .contains("Количество")
            );
        }
    }
}
