// The order page's own script. The checkout's widget tells the page how the payment ended
// (`checkout:paid`, `checkout:declined`, bubbling from its element); the page then asks the
// shop's server to confirm the payment with the checkout. The browser's word is only a hint:
// the server marks the order paid from what the checkout says, never from this request.
//
// What the page heard is kept in `window.shop.events` (for the page's other scripts).
const shop = (window.shop = { events: [] });
const state = document.getElementById("order-state");

const show = (text, name) => {
  if (!state) return;
  state.textContent = text;
  state.dataset.state = name;
};

async function confirmOrder(order) {
  show("Проверяем оплату…", "confirming");
  for (let attempt = 0; attempt < 8; attempt++) {
    try {
      const answer = await fetch(`/orders/${encodeURIComponent(order)}/confirm`, { method: "POST" });
      if (answer.ok) {
        const confirmed = await answer.json();
        if (confirmed.state === "paid") {
          show("Заказ оплачен", "paid");
          return;
        }
      }
    } catch {
      // No answer: ask again below.
    }
    await new Promise((resolve) => setTimeout(resolve, Math.min(4000, 250 * 2 ** attempt)));
  }
  show("Оплата ещё не подтверждена: мы сообщим, когда она поступит", "unconfirmed");
}

document.addEventListener("checkout:paid", (event) => {
  shop.events.push({ name: "checkout:paid", payment_id: event.detail?.payment_id, detail: event.detail });
  confirmOrder(event.target.dataset.order);
});
document.addEventListener("checkout:declined", (event) => {
  shop.events.push({ name: "checkout:declined", code: event.detail?.code, detail: event.detail });
  show("Оплата не прошла", "declined");
});
