from django.db import models


class Order(models.Model):
    name = models.CharField(max_length=100)
    receipt_sent = models.BooleanField(default=False)

    class Meta:
        app_label = "shop"
