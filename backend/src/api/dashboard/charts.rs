//! The dashboard's pictures, drawn by the server as SVG (no script): a bar per day, a pair of
//! bars where two series meet, each bar titled with its figures (what a pointer shows), the
//! whole picture described for a screen reader.

use maud::{Markup, html};

use super::rub;
use crate::store::reports::Day;

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 220.0;
const LEFT: f64 = 8.0;
const TOP: f64 = 16.0;
const BOTTOM: f64 = 24.0;
pub const DAY_MS: i64 = 86_400_000;
/// The charts' span, in days.
pub const DAYS: usize = 30;
/// Moscow is UTC+3 all year: its days start at 21:00 UTC.
const MOSCOW_MS: i64 = 3 * 3600 * 1000;

/// The start of the first of the [`DAYS`] Moscow days that end with the one `now_ms` is in.
pub fn first_day(now_ms: i64) -> i64 {
    let today = (now_ms + MOSCOW_MS).div_euclid(DAY_MS) * DAY_MS - MOSCOW_MS;
    today - (DAYS as i64 - 1) * DAY_MS
}

/// `part` of `whole` as `97,5 %`.
pub fn percent(part: i64, whole: i64) -> String {
    if whole == 0 {
        return "—".into();
    }
    let tenths = (part * 1000 + whole / 2) / whole;
    format!("{},{} %", tenths / 10, tenths % 10)
}

/// A day's label: `05.12`.
fn day_label(since_ms: i64, day: usize) -> String {
    super::when(since_ms + day as i64 * DAY_MS + 12 * 3600 * 1000)[..5].to_owned()
}

/// One series to draw: its CSS class, its name in the legend, a bar's value and title.
struct Series {
    class: &'static str,
    name: &'static str,
    values: Vec<i64>,
    titles: Vec<String>,
}

fn bars(since_ms: i64, label: &str, summary: String, series: &[Series], top: String) -> Markup {
    let days = series.first().map_or(0, |s| s.values.len());
    let max = series
        .iter()
        .flat_map(|s| s.values.iter().copied())
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let plot_height = HEIGHT - TOP - BOTTOM;
    let slot = (WIDTH - LEFT) / days.max(1) as f64;
    let bar = (slot * 0.8) / series.len().max(1) as f64;
    html! {
        figure.chart {
            svg viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) role="img" aria-label=(format!("{label}. {summary}")) {
                line.axis x1=(LEFT) y1=(HEIGHT - BOTTOM) x2=(WIDTH) y2=(HEIGHT - BOTTOM) {}
                text.tick x=(LEFT) y=(TOP - 4.0) { (top) }
                @for day in 0..days {
                    @for (i, s) in series.iter().enumerate() {
                        @let h = s.values[day] as f64 / max * plot_height;
                        @let x = LEFT + day as f64 * slot + slot * 0.1 + i as f64 * bar;
                        rect class=(s.class) x=(format!("{x:.1}")) y=(format!("{:.1}", HEIGHT - BOTTOM - h)) width=(format!("{bar:.1}")) height=(format!("{h:.1}")) {
                            title { (s.titles[day]) }
                        }
                    }
                    @if day + 1 == days {
                        // The last day's label ends at the right edge, not past it.
                        text.tick x=(WIDTH) y=(HEIGHT - 6.0) text-anchor="end" { (day_label(since_ms, day)) }
                    } @else if day % 5 == 0 && day + 3 < days {
                        text.tick x=(format!("{:.1}", LEFT + day as f64 * slot)) y=(HEIGHT - 6.0) { (day_label(since_ms, day)) }
                    }
                }
            }
            figcaption {
                @for s in series {
                    span.legend { span class=(format!("swatch {}", s.class)) {} (s.name) }
                }
            }
        }
    }
}

/// Payments' and refunds' sums per day.
pub fn money_per_day(since_ms: i64, payments: &[Day], refunds: &[Day]) -> Markup {
    let title = |what: &str, days: &[Day]| -> Vec<String> {
        days.iter()
            .enumerate()
            .map(|(i, d)| {
                format!(
                    "{}: {what} {} ({})",
                    day_label(since_ms, i),
                    rub(d.total),
                    d.count
                )
            })
            .collect()
    };
    let max = payments
        .iter()
        .chain(refunds)
        .map(|d| d.total)
        .max()
        .unwrap_or(0);
    let total = |days: &[Day]| days.iter().map(|d| d.total).sum::<i64>();
    bars(
        since_ms,
        "Платежи и возвраты по дням за 30 дней",
        format!(
            "Платежей на {}, возвратов на {}",
            rub(total(payments)),
            rub(total(refunds))
        ),
        &[
            Series {
                class: "paid",
                name: "платежи",
                values: payments.iter().map(|d| d.total).collect(),
                titles: title("платежи", payments),
            },
            Series {
                class: "refunded",
                name: "возвраты",
                values: refunds.iter().map(|d| d.total).collect(),
                titles: title("возвраты", refunds),
            },
        ],
        rub(max),
    )
}

/// Payments' and refunds' counts per day.
pub fn count_per_day(since_ms: i64, payments: &[Day], refunds: &[Day]) -> Markup {
    let title = |what: &str, days: &[Day]| -> Vec<String> {
        days.iter()
            .enumerate()
            .map(|(i, d)| format!("{}: {what} {}", day_label(since_ms, i), d.count))
            .collect()
    };
    let max = payments
        .iter()
        .chain(refunds)
        .map(|d| d.count)
        .max()
        .unwrap_or(0);
    let count = |days: &[Day]| days.iter().map(|d| d.count).sum::<i64>();
    bars(
        since_ms,
        "Число платежей и возвратов по дням за 30 дней",
        format!("Платежей {}, возвратов {}", count(payments), count(refunds)),
        &[
            Series {
                class: "paid",
                name: "платежи",
                values: payments.iter().map(|d| d.count).collect(),
                titles: title("платежей", payments),
            },
            Series {
                class: "refunded",
                name: "возвраты",
                values: refunds.iter().map(|d| d.count).collect(),
                titles: title("возвратов", refunds),
            },
        ],
        max.to_string(),
    )
}

/// Delivery attempts per day, and how many of them the endpoint answered with 2xx (`total`).
pub fn success_per_day(since_ms: i64, attempts: &[Day]) -> Markup {
    let tried: i64 = attempts.iter().map(|d| d.count).sum();
    let succeeded: i64 = attempts.iter().map(|d| d.total).sum();
    let max = attempts.iter().map(|d| d.count).max().unwrap_or(0);
    let titles = |ok: bool| -> Vec<String> {
        attempts
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let (n, what) = if ok {
                    (d.total, "успешных")
                } else {
                    (d.count - d.total, "неудачных")
                };
                format!(
                    "{}: {what} {n} из {} ({})",
                    day_label(since_ms, i),
                    d.count,
                    percent(d.total, d.count)
                )
            })
            .collect()
    };
    let chart = bars(
        since_ms,
        "Доставка вебхуков по дням за 30 дней",
        format!("Успешных попыток {} из {tried}", percent(succeeded, tried)),
        &[
            Series {
                class: "delivered",
                name: "успешные попытки",
                values: attempts.iter().map(|d| d.total).collect(),
                titles: titles(true),
            },
            Series {
                class: "failed",
                name: "неудачные попытки",
                values: attempts.iter().map(|d| d.count - d.total).collect(),
                titles: titles(false),
            },
        ],
        max.to_string(),
    );
    html! {
        p.rate { "За 30 дней успешных: " strong { (percent(succeeded, tried)) } " (попыток: " (tried) ")" }
        (chart)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percents_round_to_a_tenth() {
        assert_eq!(percent(0, 0), "—");
        assert_eq!(percent(1, 3), "33,3 %");
        assert_eq!(percent(2, 3), "66,7 %");
        assert_eq!(percent(5, 5), "100,0 %");
    }

    #[test]
    fn a_chart_draws_a_titled_bar_per_day_and_series() {
        let mut payments = vec![Day::default(); 30];
        payments[29] = Day {
            count: 2,
            total: 30_000,
        };
        let refunds = vec![Day::default(); 30];
        let svg = money_per_day(0, &payments, &refunds).into_string();
        assert_eq!(svg.matches("<rect").count(), 60, "{svg}");
        assert!(svg.contains("платежи 300,00\u{a0}₽ (2)"), "{svg}");
        assert!(svg.contains("role=\"img\""), "{svg}");
    }
}
